"""DriverRunner: the model runner of an engine core that drives the other ranks of its group.

Design note. The engine loop stays as it is: it talks to a `DriverRunner`, which is its
`ModelRunner` plus three things per step. Before the launch, it packs the plan into the step
packet (`runner.inputs`: one int32 buffer) together with the copy steps that have landed since the
last packet, broadcasts it on the control group and has the runner upload that same packet: every
rank unpacks the same words into the same tensors and runs the same forward (its shard). After
sampling (rank 0 only: one sampler, one set of seeds), it broadcasts the sampled token ids on the
device group, so the next step's deferred inputs (overlap scheduling) exist on every rank without
a host round trip. Copies: every rank runs the plan's KV page copies on its own shard of the pool;
rank 0 acknowledges a step's copies to the scheduler when its own land, and the packet carries
those acknowledgements so every other rank orders later work after its own copies of that step
(`PageCopier.retire`) before the scheduler can hand the pages to a new owner.

When data-parallel engine cores share one world (expert parallelism across them) every core runs
every step: the cores agree each step on the most tokens any of them runs (`pad_to`, the size of
the token shards the MoE layers exchange), and a core with nothing to do runs a one-token dummy
forward that writes no KV.

Failures: a step that fails on rank 0 leaves the other ranks inside (or waiting for) its
collectives, so no later step could line up with theirs; a dead rank fails the next collective.
Either is a `FatalEngineError` (naming the rank that died, if one did): the core exits, its ranks
are stopped (and die with it in any case), and the gateway's supervisor starts a fresh core.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..core.faults import FatalEngineError
from ..runner.inputs import stop_packet
from ..runner.model_runner import LaunchedStep, ModelRunner
from .launch import EngineRanks
from .ranks import FIRST_WORDS

log = logging.getLogger("lightspeed.distributed")


class AckingCopier:
    """Rank 0's page copier, remembering the steps whose copies it saw land (for the next packet)."""

    def __init__(self, inner):
        self.inner = inner
        self._acks: list[int] = []

    def poll(self) -> list[int]:
        done = self.inner.poll()
        self._acks += done
        return done

    def wait_all(self) -> list[int]:
        done = self.inner.wait_all()
        self._acks += done
        return done

    def take_acks(self) -> list[int]:
        acks, self._acks = self._acks, []
        return acks

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _DummyPlan:
    """One decode row of one token that writes nothing (slot -1) and samples nothing: the forward an
    idle data-parallel core runs so the expert-parallel collectives of the others complete."""

    def __init__(self, step_id: int):
        self.step_id = step_id
        self.input_ids = np.zeros(1, np.int32)
        self.positions = np.zeros(1, np.int32)
        self.slot_mapping = np.full(1, -1, np.int32)
        self.query_start_loc = np.array([0, 1], np.int32)
        self.seq_lens = np.ones(1, np.int32)
        self.page_table = np.zeros((1, 1), np.int32)
        self.req_ids = np.full(1, -1, np.int64)
        self.req_slots = np.zeros(1, np.int32)
        self.logits_indices = np.empty(0, np.int32)
        self.sample_batch_rows = np.empty(0, np.int64)
        self.deferred_input_mask = np.zeros(1, np.int32)
        self.deferred_src_index = np.zeros(1, np.int32)
        self.write_back = self.load_back = np.empty((0, 2), np.int32)
        self.forward_waits_for_copies = False
        self.num_decodes, self.num_prefills, self.num_decode_tokens, self.max_query_len = 1, 0, 1, 1


class DriverRunner:
    """`ModelRunner` interface (launch / collect / requests) over every rank of the attention group."""

    def __init__(self, runner: ModelRunner, ranks: EngineRanks):
        self.runner, self.ranks = runner, ranks
        self.copier = AckingCopier(runner.kv_cache.copier)
        runner.kv_cache.copier = self.copier  # the engine polls it there
        self._lockstep = ranks.topology.lockstep
        self._last_step_id = 0
        self._closed = False

    def __getattr__(self, name):  # add_request, remove_request, needs_host_tokens, kv_cache, ...
        return getattr(self.runner, name)

    @property
    def rank_pids(self) -> list[int]:
        return self.ranks.processes.pids

    @property
    def steps_with_others(self) -> bool:
        return self._lockstep

    def agree_to_step(self, has_work: bool, stopping: bool) -> tuple[bool, bool]:
        if not self._lockstep:
            return has_work, stopping
        try:
            work, stop = self.ranks.cores_max([int(has_work), int(stopping)])
        except Exception as exc:
            raise self._fatal(exc) from exc
        return bool(work), bool(stop)

    def step_without_plan(self) -> None:
        """The engine collects without launching (a grammar waits for its token): the cores that step
        together still agree on this step, and this one runs the dummy forward if another runs tokens."""
        if not self._lockstep:
            return
        try:
            pad_to = self.ranks.cores_max([0])[0]
            if pad_to:
                self._dummy_step(_DummyPlan(self._last_step_id), pad_to)
        except Exception as exc:
            raise self._fatal(exc) from exc

    def launch(self, plan) -> LaunchedStep:
        self._last_step_id = int(plan.step_id)
        try:
            return self._launch(plan)
        except Exception as exc:
            raise self._fatal(exc) from exc

    def _fatal(self, exc: Exception) -> FatalEngineError:
        if isinstance(exc, FatalEngineError):
            return exc
        died = self.ranks.processes.diagnose()  # which rank died, if one did
        world = self.ranks.topology.world_size
        reason = (f"tensor/expert-parallel {died}" if died is not None
                  else f"a step of {world} ranks failed on rank {self.ranks.rank} ({type(exc).__name__})")
        return FatalEngineError(f"{reason}; the engine stopped (its ranks cannot line up again): "
                                f"{type(exc).__name__}: {exc}", reason=reason)

    def _launch(self, plan) -> LaunchedStep:
        num_tokens = plan.input_ids.shape[0]
        pad_to = 0
        if self._lockstep:
            pad_to = self.ranks.cores_max([num_tokens])[0]
            if num_tokens == 0 and pad_to:
                self._dummy_step(plan, pad_to)
                return self.runner.launch(plan)  # copies only, then nothing to sample
        inputs, load = self.runner.inputs, self.runner.expert_load
        report = bool(num_tokens) and load.needs_reduce and load.due()
        packet = inputs.pack(plan, acks=self.copier.take_acks(), pad_to=pad_to, report_load=report,
                             min_words=FIRST_WORDS)
        self.ranks.send_packet(packet)
        inputs.stage(packet)
        self.runner.model.model.tokens.pad_to = pad_to or None
        launched = self.runner.launch(plan)
        if packet.num_sampled:
            self.ranks.send_tokens(self.runner.last_sampled.to(torch.int64))
        if report:  # every rank routed its own token shard: sum the counters here
            total = load.local_total()
            self.ranks.reduce_to_leader(total)
            load.refresh(total)
        return launched

    def expert_load_counts(self) -> list[int] | None:
        load = self.runner.expert_load
        return load.latest() if load.needs_reduce else self.runner.expert_load_counts()

    @torch.inference_mode()
    def _dummy_step(self, plan, pad_to: int) -> None:
        """This core has no tokens but another has: run the one-token forward (and this plan's copies)."""
        dummy = _DummyPlan(int(plan.step_id))
        dummy.write_back, dummy.load_back = plan.write_back, plan.load_back
        dummy.forward_waits_for_copies = bool(plan.forward_waits_for_copies)
        inputs = self.runner.inputs
        packet = inputs.pack(dummy, acks=self.copier.take_acks(), pad_to=pad_to, min_words=FIRST_WORDS)
        self.ranks.send_packet(packet)
        self.runner.model.model.tokens.pad_to = pad_to
        t = inputs.unpack(packet, None)
        self.runner.forward_unsampled(packet.view(), t)

    def collect(self, launched: LaunchedStep):
        try:
            return self.runner.collect(launched)
        except Exception as exc:
            raise self._fatal(exc) from exc

    def execute(self, plan):
        return self.collect(self.launch(plan))

    def shutdown(self, graceful: bool = True) -> None:
        """Tell the other ranks to stop, wait for them, leave the world (idempotent). Not graceful
        (after a failure: they may be stuck in a collective): terminate them at once."""
        if self._closed:
            return
        self._closed = True
        graceful = graceful and self.ranks.processes.dead() is None
        if graceful:
            self.ranks.processes.expect_exit()  # before the packet: a rank may exit the moment it reads it
            try:
                self.ranks.send_packet(stop_packet(torch.zeros(FIRST_WORDS, dtype=torch.int32)))
            except RuntimeError as exc:
                log.warning("could not tell the ranks to stop: %s", exc)
                graceful = False
        self.ranks.close(graceful=graceful)
