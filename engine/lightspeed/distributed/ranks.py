"""`Ranks`: this process's place in its torch.distributed world, its groups and their collectives.

Every rank creates the same groups in the same order (torch.distributed requires it):
- the default group (NCCL on GPU, gloo on CPU) and one host-side gloo group over the world, for
  agreements (page counts, CUDA-graph capture);
- per attention group: a device group (its tensor-parallel collectives and the broadcast of the
  sampled tokens) and a gloo control group on which its leader broadcasts each step's packet;
- the engine cores' gloo group, when several step together (their per-step agreements).
The MoE group is the attention group (tensor or expert parallel within it) or the whole world
(expert parallel across data-parallel attention groups).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch
import torch.distributed as dist

from ..layers import ParallelContext, ParallelLayout
from ..runner.inputs import HEADER_WORDS, StepPacket
from .topology import Topology

log = logging.getLogger("lightspeed.distributed")

# The control broadcast sends this many words first (a decode step's whole packet fits) and the
# rest, if any, in a second broadcast: one round trip for most steps.
FIRST_WORDS = 4096


class Ranks:
    """Groups and collectives of one rank. `rank` is global; `leader` is its attention group's rank 0."""

    def __init__(self, topology: Topology, rank: int, device: torch.device, store, timeout_s: float):
        self.topology, self.rank, self.device = topology, rank, device
        top = topology
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend, store=store, rank=rank, world_size=top.world_size, timeout=timeout)
        everyone = list(range(top.world_size))
        self.host_group = dist.new_group(everyone, backend="gloo", timeout=timeout) if backend != "gloo" else None
        device_groups, control_groups = [], []
        for group in range(top.dp):
            members = top.attention_ranks(group)
            device_groups.append(dist.new_group(members, backend=backend, timeout=timeout) if top.tp > 1 else None)
            control_groups.append(dist.new_group(members, backend="gloo", timeout=timeout) if top.tp > 1 else None)
        self.cores_group = None
        if top.dp > 1:
            leaders = [g * top.tp for g in range(top.dp)]
            self.cores_group = dist.new_group(leaders, backend="gloo", timeout=timeout)
        self.group_index = top.group_of(rank)
        self.leader = self.group_index * top.tp
        self.device_group = device_groups[self.group_index]
        self.control_group = control_groups[self.group_index]
        attention = ParallelContext(rank - self.leader, top.tp, self.device_group)
        if top.ep == top.world_size and top.ep > 1:
            moe = ParallelContext(rank, top.world_size, None)  # the default group spans every rank
        else:
            moe = attention
        self.layout = ParallelLayout(attention, attention, moe, expert_parallel=top.ep > 1,
                                     sequence_parallel=top.sequence_parallel)
        self._recv_turn = 0
        self._recv: list[torch.Tensor] = []
        self._pinned = device.type == "cuda"

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    # -- agreements over the world (host values) ---------------------------------------------------
    def agree_min(self, value: int) -> int:
        """The smallest `value` over every rank of the world (page counts: every pool holds them)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.host_group)
        return int(t.item())

    def agree_all(self, flag: bool) -> bool:
        return bool(self.agree_min(int(flag)))

    # -- the step packet (leader -> its attention group, host memory over gloo) ----------------------
    def send_packet(self, packet: StepPacket) -> None:
        if self.control_group is None:
            return
        host = packet.host
        dist.broadcast(host[:FIRST_WORDS], src=self.leader, group=self.control_group)
        if packet.total > FIRST_WORDS:
            dist.broadcast(host[FIRST_WORDS:packet.total], src=self.leader, group=self.control_group)

    def receive_packet(self) -> StepPacket:
        buf = self._receive_buffer(FIRST_WORDS)
        dist.broadcast(buf[:FIRST_WORDS], src=self.leader, group=self.control_group)
        total = int(buf[HEADER_WORDS - 1])
        if total > FIRST_WORDS:
            if buf.numel() < total:
                grown = self._receive_buffer(total)
                grown[:FIRST_WORDS] = buf[:FIRST_WORDS]
                buf = grown
            dist.broadcast(buf[FIRST_WORDS:total], src=self.leader, group=self.control_group)
        return StepPacket(buf)

    def _receive_buffer(self, words: int) -> torch.Tensor:
        """Fresh on CPU (the step's tensors are views of it), two alternating pinned buffers on GPU
        (the upload of the step before may still be reading the other)."""
        if not self._pinned:
            return torch.empty(max(words, FIRST_WORDS), dtype=torch.int32)
        if not self._recv or self._recv[0].numel() < words:
            size = max(words, 1 << 16)
            self._recv = [torch.empty(size, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self._recv_turn ^= 1
        return self._recv[self._recv_turn]

    # -- sampled tokens (device memory) ---------------------------------------------------------
    def send_tokens(self, tokens: torch.Tensor) -> None:
        """The leader's sampled token ids int64 [S] to its group: the next step's deferred inputs."""
        if self.device_group is not None:
            dist.broadcast(tokens, src=self.leader, group=self.device_group)

    def receive_tokens(self, num_sampled: int) -> torch.Tensor:
        tokens = torch.empty(num_sampled, dtype=torch.int64, device=self.device)
        dist.broadcast(tokens, src=self.leader, group=self.device_group)
        return tokens

    def reduce_to_leader(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the attention group into the leader's copy (expert-load counters)."""
        if self.device_group is not None:
            dist.reduce(tensor, dst=self.leader, group=self.device_group)

    # -- engine cores stepping together -----------------------------------------------------------
    def cores_max(self, values: list[int]) -> list[int]:
        """Element-wise max of `values` over the engine cores of the world (the cores group)."""
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.cores_group)
        return t.tolist()

    def close(self) -> None:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # a peer already gone: nothing left to release cleanly
                log.debug("destroy_process_group: %s", exc)
