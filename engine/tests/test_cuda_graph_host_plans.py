"""Host-planned kernels inside the decode graphs (runner/cuda_graph.py, `HostPlans`): FlashInfer's MLA
decode (over the stand-in of mla/tests/flashinfer_standin.py) in a tiny DeepSeek-V3, capture and replay
simulated on the CPU. The capture is two warm-ups and a forward the adapter sees as captured (a plan in
it raises); a replay re-runs that forward's device work seen as captured, so the only host plan a replay
gets is the runner's `replan` before it. Every attention call of every replayed and eager step must
equal the reference on the step's true metadata, each replay must be preceded by exactly one host plan
(shared by the layers), and FP8 caches never select the kernel."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import lightspeed_kernel as lk
import numpy as np
import pytest
import torch
from engine_driver import make_engine
from lightspeed.core.messages import SamplingSpec
from lightspeed.layers import mla as mla_layers
from lightspeed.layers.attention import HostPlans
from lightspeed.runner.cuda_graph import CudaGraphRunner
from lightspeed_mla import flashinfer_graph, mla_decode_reference, registration
from lightspeed_mla import flashinfer_mla as fim

HOPPER = lk.Platform.parse("sm_90")
STANDIN = Path(__file__).resolve().parents[2] / "mla" / "tests" / "flashinfer_standin.py"
PROMPT_LENS = [1, 15, 16, 17, 31, 33, 5, 40]
MAX_TOKENS = [20, 3, 12, 18, 9, 15, 6, 11]


def _standin():
    if "flashinfer_standin" not in sys.modules:  # also imported by name when mla/tests runs in this session
        spec = importlib.util.spec_from_file_location("flashinfer_standin", STANDIN)
        module = importlib.util.module_from_spec(spec)
        sys.modules["flashinfer_standin"] = module
        spec.loader.exec_module(module)
    return sys.modules["flashinfer_standin"]


def _registry(monkeypatch):
    _standin().install(monkeypatch)
    reg = lk.KernelRegistry(load_plugins=None)
    registration.register(reg)  # the stand-in installed: `mla_decode_flashinfer` registers, loading it
    return reg


@contextlib.contextmanager
def _captured(monkeypatch):
    with monkeypatch.context() as m:
        for module in (fim, flashinfer_graph):
            m.setattr(module, "_capturing", lambda device: True)
        yield


class _SimulatedGraphs(CudaGraphRunner):
    """The runner's capture protocol (`_start_capture`, warm-ups, the captured forward, `_finish_capture`)
    and its `forward`, with the CUDA graph itself simulated (see the module note)."""

    def capture_on_cpu(self, monkeypatch) -> None:
        self.monkeypatch = monkeypatch
        keys = [(s, 1) for s in self.batch_sizes] + [(s, self.spec_row_tokens) for s in self.spec_batch_sizes]
        for key in sorted(keys, key=lambda k: -k[0] * k[1]):
            host_plans = self._start_capture(key)
            for _ in range(2):
                self._forward(*key, host_plans)
            host_plans.capturing = True
            with _captured(monkeypatch):
                self._forward(*key, host_plans)
            self._finish_capture(key, host_plans)
            self._graphs[key] = None

    def _replay(self, key: tuple[int, int]) -> None:
        replay = HostPlans(self._padded_lengths(key))
        replay.capturing = True
        with _captured(self.monkeypatch):
            self._forward(*key, replay)
        assert all(any(p is q for q in self._host_plans[key].plans) for p in replay.plans)  # the captured plans


class _Checked:
    """Wraps the op's run: every FlashInfer call must equal the reference on the true metadata of the
    forward in progress (`truth(plan)`: its seq_lens and query_start_loc)."""

    def __init__(self, impl, scale):
        self.impl, self.scale, self.truth, self.calls = impl, scale, None, 0
        self.plan, self.bind, self.workspace_bytes = impl.plan, impl.bind, impl.workspace_bytes

    def run(self, plan, q, cache, page_table, out, lse=None):
        got = self.impl.run(plan, q, cache, page_table, out, lse)
        rows = plan.batch_size
        seq_lens, qsl = self.truth(plan)
        ref = mla_decode_reference(q, cache, page_table[:rows], seq_lens[:rows], qsl[: rows + 1], self.scale)[0]
        assert torch.equal(got, ref)
        self.calls += 1
        return got

    def __call__(self, *args, **kwargs):
        raise AssertionError("the engine runs MLA decode through plan / bind / run")


def _engine(monkeypatch, spec_tokens: int):
    settings = dict(dtype="bfloat16", max_num_seqs=8, kv_cache_memory="16MiB", host_cache_memory=0,
                    page_size=16, enable_prefix_cache=False)
    if spec_tokens:
        settings["speculative_config"] = {"method": "ngram", "num_speculative_tokens": spec_tokens}
    engine = make_engine("tiny-deepseek-v3", **settings)
    runner = engine.runner
    backend = runner.model.model.mla_backend
    reg = _registry(monkeypatch)
    impl = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, traits={"page_size": 16, "kv_dtype": "bf16"})
    assert impl.name == fim.KERNEL_NAME
    checked = _Checked(impl.impl, backend.softmax_scale)
    real_kernel = mla_layers.MLABackend.kernel
    monkeypatch.setattr(mla_layers.MLABackend, "kernel", lambda self, mode, dtype, device, **kw:
                        checked if mode == "decode" else real_kernel(self, mode, dtype, device, **kw))
    backend._kernels.clear()
    return runner, engine.scheduler, checked


def _submit(runner, sched):
    from lightspeed_scheduler import RequestSpec

    rng = np.random.default_rng(0)
    for i, (n, max_tokens) in enumerate(zip(PROMPT_LENS, MAX_TOKENS, strict=True)):
        prompt = rng.integers(3, 200, n).tolist()
        rid = sched.submit(RequestSpec(rid=f"r{i}", token_ids=prompt, max_new_tokens=max_tokens, ignore_eos=True))
        runner.add_request(rid, SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), prompt)


def _graph_plans(graphs) -> list:
    return [p for hp in graphs._host_plans.values() for p in hp.plans]


@pytest.mark.parametrize("spec_tokens", [0, 3], ids=["one_token", "spec_k3"])
def test_replayed_graphs_replan_flashinfer_mla_before_every_replay(monkeypatch, spec_tokens):
    runner, sched, checked = _engine(monkeypatch, spec_tokens)
    graphs = _SimulatedGraphs(runner.model, runner.kv_cache, batch_sizes=[1, 2, 4, 8], max_model_len=256,
                              vocab_size=runner.vocab_size, device=torch.device("cpu"), spec_tokens=spec_tokens)
    static = lambda plan: (graphs.seq_lens, graphs._query_start_loc[plan.num_tokens // plan.batch_size])  # noqa: E731
    checked.truth = static  # capture and replays: what the static buffers hold
    graphs.capture_on_cpu(monkeypatch)
    plans = _graph_plans(graphs)
    keys = len(graphs.batch_sizes) + len(graphs.spec_batch_sizes)
    assert len(graphs._host_plans) == keys and len(plans) == keys  # one host plan per graph, all layers share it
    assert all(isinstance(p, flashinfer_graph.FlashInferGraphPlan) for p in plans)
    _submit(runner, sched)
    rng = np.random.default_rng(1)
    replays, padded, worst = 0, 0, 0.0
    with torch.inference_mode():
        while sched.has_unfinished():
            if spec_tokens:
                slots = sched.config.num_slots  # max_num_seqs + the spare slots of overlapped steps
                counts = rng.integers(0, spec_tokens + 1, slots).astype(np.int32)
                plan = sched.next_plan(counts, rng.integers(3, 200, (slots, spec_tokens)).astype(np.int32))
            else:
                plan = sched.next_plan()
            runner._bind_new_rows(plan)
            if plan.input_ids.shape[0] == 0:
                sched.advance(plan, [])
                continue
            t = runner.inputs.build(plan, runner._prev_sampled)
            checked.truth = lambda plan: (t.seq_lens, t.query_start_loc)  # noqa: B023
            eager = runner.forward_eager(plan, t).clone()
            logits = eager
            if graphs.can_run(plan) and (not spec_tokens or plan.num_decode_tokens > plan.num_decodes):
                q = graphs._row_tokens(plan)
                size = graphs.padded_size(plan.num_decodes, q)
                checked.truth = static
                before = [p.wrapper.plans for p in plans]
                logits = graphs.forward(plan, t).clone()
                graph_plan = graphs._host_plans[size, q].plans[0]
                after = [p.wrapper.plans for p in plans]
                # exactly one host plan before the replay, of that graph's wrapper
                assert [a - b for a, b in zip(after, before, strict=True)] == [int(p is graph_plan) for p in plans]
                worst = max(worst, (logits - eager).abs().max().item() / eager.abs().max().item())
                replays, padded = replays + 1, padded + size - plan.num_decodes
            if spec_tokens:
                sched.advance(plan, logits.argmax(-1).int().numpy(), np.ones(plan.num_decodes, np.int32))
            else:
                sched.advance(plan, runner.collect(runner._sample(plan, logits, t)).tokens)
    assert replays >= 8 and padded > 0 and checked.calls > 0
    assert worst < 2e-2, worst  # bf16 GEMMs over the padded batch; the attention itself is checked exactly


def test_fp8_caches_never_select_flashinfer(monkeypatch):
    reg = _registry(monkeypatch)
    monkeypatch.setattr(mla_layers, "platform_of", lambda device: HOPPER)
    monkeypatch.setattr(mla_layers, "select_kernel", reg.select)
    backend = mla_layers.MLABackend(num_heads=16, softmax_scale=0.1)
    device = torch.device("cpu")
    pick = {fp8: backend.kernel("decode", torch.bfloat16, device, fp8_kv=fp8, page_size=64) for fp8 in (False, True)}
    names = {id(s.impl): s.name for s in reg.specs("mla", "decode")}
    assert names[id(pick[False])] == fim.KERNEL_NAME and names[id(pick[True])] == "mla_decode_triton"
