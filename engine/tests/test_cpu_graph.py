"""Native CPU graphs of decode steps (runner/cpu_graph.py): replay == eager step after step, and
capture falls back to eager steps where the forward is not all native kernels."""

import pytest
import torch
from lightspeed.runner.cpu_graph import CpuGraphRunner, build_cpu_graph_runner
from lightspeed_kernel.cpu import NATIVE_AVAILABLE
from test_cuda_graph import MAX_TOKENS, _engine, _submit_varied

pytestmark = pytest.mark.skipif(not NATIVE_AVAILABLE, reason="no native CPU kernels on this machine")


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_replay_matches_eager(tiny_model_dir, quantization):
    runner, sched = _engine(tiny_model_dir, max_num_seqs=16, kv_cache_memory="16MiB", quantization=quantization)
    graphs = runner.graphs
    assert isinstance(graphs, CpuGraphRunner) and sorted(graphs._graphs_sizes(1)) == [1, 2, 4, 8, 16]
    _submit_varied(runner, sched)
    worst, replays = 0.0, 0
    with torch.inference_mode():
        while sched.has_unfinished():
            plan = sched.next_plan()
            runner._bind_new_rows(plan)
            t = runner.inputs.build(plan, runner._prev_sampled)
            eager = runner.forward_eager(plan, t).clone()
            logits = eager
            if graphs.can_run(plan):
                logits = graphs.forward(plan, t).clone()
                worst, replays = max(worst, (logits - eager).abs().max().item()), replays + 1
            sched.advance(plan, runner.collect(runner._sample(plan, logits, t)).tokens)
    assert replays >= max(MAX_TOKENS) - 1 and graphs.num_replays == replays
    assert worst < 1e-4, worst


def test_no_graphs_for_float_weights_or_eager_mode(tiny_model_dir):
    runner, _ = _engine(tiny_model_dir)  # float weights: torch's GEMM, nothing to record
    assert runner.graphs is None
    runner, _ = _engine(tiny_model_dir, quantization="int4", enforce_eager=True)
    assert runner.graphs is None


def test_a_forward_with_torch_compute_is_not_recorded(tiny_model_dir):
    runner, _ = _engine(tiny_model_dir, quantization="int4")
    # a float LM head again: its product runs on torch's GEMM, which a replay would skip
    lm_head = runner.model.lm_head
    lm_head.weight = torch.nn.Parameter(lm_head.weight.dequantize(), requires_grad=False)
    assert build_cpu_graph_runner(runner.model, runner.kv_cache, batch_sizes=[1, 2], max_model_len=256,
                                  vocab_size=runner.vocab_size, device=torch.device("cpu")) is None
