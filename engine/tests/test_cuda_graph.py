"""CUDA-graph decode replay (runner/cuda_graph.py): config and CPU fallback here, graph == eager on GPU."""

import numpy as np
import pytest
import torch
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.config import EngineConfig
from lightspeed.core.messages import SamplingSpec
from lightspeed.runner.cuda_graph import CudaGraphRunner, build_cuda_graph_runner

gpu = pytest.mark.gpu

# Prompt lengths around page boundaries (page_size 16) and outputs of different lengths, so the
# decode batch shrinks step by step through padded (3, 5, 7, ...) and captured sizes.
PROMPT_LENS = [1, 15, 16, 17, 31, 33, 47, 5, 64, 2, 90, 40, 13]
MAX_TOKENS = [40, 3, 18, 33, 25, 9, 50, 12, 29, 6, 21, 45, 15]
# One request grows from 250 to 271 tokens: past the 256-key attention split of the graphs' plan.
LONG_PROMPT_LENS = [250 if n == 90 else n for n in PROMPT_LENS]


def test_capture_sizes_follow_config():
    assert EngineConfig().cuda_graph_batch_sizes() == [1, 2, 4, 8, 16, 24, *range(32, 256, 16), 256]
    assert EngineConfig(max_num_seqs=8).cuda_graph_batch_sizes() == [1, 2, 4, 8]
    assert EngineConfig(max_num_seqs=5).cuda_graph_batch_sizes() == [1, 2, 4, 5]
    assert EngineConfig(cuda_graph_max_batch_size=40).cuda_graph_batch_sizes() == [1, 2, 4, 8, 16, 24, 32, 40]
    assert EngineConfig(cuda_graph_max_batch_size=1).cuda_graph_batch_sizes() == [1]
    assert EngineConfig(enforce_eager=True).cuda_graph_batch_sizes() == []
    assert EngineConfig.from_cli(enforce_eager="true").enforce_eager is True
    with pytest.raises(ValueError, match="cuda_graph_max_batch_size"):
        EngineConfig(cuda_graph_max_batch_size=0)
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(enforce_eager="yes")


def _engine(model_dir, **overrides):
    """The engine's runner and scheduler, stepped by hand below to compare graph and eager forwards
    on the same cache. No host tier: these loops run no KV copies."""
    engine = make_engine(model_dir, **{"host_cache_memory": 0, **overrides})
    return engine.runner, engine.scheduler


def test_graphs_are_off_on_cpu(tiny_model_dir):
    runner, _ = _engine(tiny_model_dir)
    assert runner.graphs is None
    assert build_cuda_graph_runner(runner.model, runner.kv_cache, batch_sizes=[1, 2], max_model_len=256,
                                   vocab_size=runner.vocab_size, device=torch.device("cpu")) is None
    with pytest.raises(ValueError, match="CUDA device"):
        CudaGraphRunner(runner.model, runner.kv_cache, batch_sizes=[1], max_model_len=256,
                        vocab_size=runner.vocab_size, device=torch.device("cpu")).capture()


class _ForwardInsteadOfReplay(CudaGraphRunner):
    """The graph runner's static buffers, padding and slicing, with each replay run as the eager
    forward it would have captured: checks the replay bookkeeping on CPU."""

    def mark_captured(self) -> None:
        keys = [(s, 1) for s in self.batch_sizes] + [(s, self.spec_row_tokens) for s in self.spec_batch_sizes]
        self._graphs = dict.fromkeys(keys)

    def _replay(self, key: tuple[int, int]) -> None:
        self._forward(*key)


@pytest.mark.parametrize("sizes", [[1, 2, 4, 8, 16], [16]])
def test_replay_bookkeeping_matches_eager_on_cpu(tiny_model_dir, sizes):
    """Padded rows, rows left over from a larger step, page tables narrower than the static one."""
    runner, sched = _engine(tiny_model_dir, max_num_seqs=16, kv_cache_memory="16MiB")
    graphs = _ForwardInsteadOfReplay(runner.model, runner.kv_cache, batch_sizes=sizes, max_model_len=256,
                                     vocab_size=runner.vocab_size, device=torch.device("cpu"))
    graphs.mark_captured()
    _submit_varied(runner, sched)
    worst, replays, padded_rows = 0.0, 0, 0
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
                n, size = plan.num_reqs, graphs.padded_size(plan.num_reqs)
                padded_rows += size - n
                # Padding rows (some left over from a larger step) write nothing into the cache.
                assert (graphs.slot_mapping[n:size] == -1).all() and (graphs.seq_lens[n:size] == 1).all()
            sched.advance(plan, runner.collect(runner._sample(plan, logits, t)).tokens)
    assert replays >= max(MAX_TOKENS) - 1
    assert padded_rows > 0
    assert worst < 1e-4, worst


@pytest.mark.parametrize("penalised", [False, True])
def test_plain_greedy_steps_take_the_graphs_tokens_on_cpu(tiny_model_dir, monkeypatch, penalised):
    """Whole steps through ModelRunner.execute: a decode step whose rows are all plain greedy takes the
    graph's argmax without calling the sampler; one with a penalised row samples eagerly. Either way the
    tokens are the eager engine's."""
    from lightspeed_scheduler import RequestSpec

    def run(with_graphs: bool) -> tuple[list[int], int, int]:
        runner, sched = _engine(tiny_model_dir, max_num_seqs=16, kv_cache_memory="16MiB")
        if with_graphs:
            runner.graphs = _ForwardInsteadOfReplay(runner.model, runner.kv_cache, batch_sizes=[1, 2, 4, 8, 16],
                                                    max_model_len=256, vocab_size=runner.vocab_size,
                                                    device=torch.device("cpu"))
            runner.graphs.mark_captured()
        for i, (prompt, max_tokens) in enumerate(_varied_prompts()):
            spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                presence_penalty=1.5 if penalised and i == 3 else 0.0)
            rid = sched.submit(RequestSpec(rid=f"r{i}", token_ids=prompt, max_new_tokens=max_tokens, ignore_eos=True))
            runner.add_request(rid, spec, prompt)
        sampled = []
        monkeypatch.setattr(runner.sampling, "sample", _counting(runner.sampling.sample, sampled))
        tokens = []
        with torch.inference_mode():
            while sched.has_unfinished():
                plan = sched.next_plan()
                result = runner.execute(plan)
                tokens += result.tokens.tolist()
                sched.advance(plan, result.tokens)
        return tokens, len(sampled), runner.graphs.num_replays if with_graphs else 0

    eager_tokens, eager_samples, _ = run(False)
    graph_tokens, graph_samples, replays = run(True)
    assert graph_tokens == eager_tokens
    assert replays > 20
    skipped = eager_samples - graph_samples  # steps that took the graph's tokens
    if penalised:  # replayed steps with request 3 in the batch sample eagerly, the ones after it do not
        assert 0 < skipped < replays
    else:
        assert skipped == replays


def _counting(fn, calls: list):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return counted


def test_speculative_replay_bookkeeping_matches_eager_on_cpu(tiny_model_dir):
    """Rows of 1..k+1 tokens padded to k + 1 per row (fixed k per graph size), provisional rows
    under overlap left aside: the logits of every real token equal the eager forward's."""
    k = 3
    runner, sched = _engine(tiny_model_dir, max_num_seqs=16, kv_cache_memory="16MiB",
                            speculative_config={"method": "ngram", "num_speculative_tokens": k})
    graphs = _ForwardInsteadOfReplay(runner.model, runner.kv_cache, batch_sizes=[1, 2, 4, 8, 16], max_model_len=256,
                                     vocab_size=runner.vocab_size, device=torch.device("cpu"), spec_tokens=k)
    graphs.mark_captured()
    _submit_varied(runner, sched)
    rng = np.random.default_rng(1)
    worst, spec_replays = 0.0, 0
    with torch.inference_mode():
        while sched.has_unfinished():
            slots = sched.config.num_slots  # max_num_seqs + the spare slots of overlapped steps
            counts = rng.integers(0, k + 1, slots).astype(np.int32)
            plan = sched.next_plan(counts, rng.integers(3, 40000, (slots, k)).astype(np.int32))
            runner._bind_new_rows(plan)
            t = runner.inputs.build(plan, runner._prev_sampled)
            eager = runner.forward_eager(plan, t).clone()
            if graphs.can_run(plan) and plan.num_decode_tokens > plan.num_decodes:
                logits = graphs.forward(plan, t).clone()
                worst, spec_replays = max(worst, (logits - eager).abs().max().item()), spec_replays + 1
            tokens = eager.argmax(-1).int().numpy()
            sched.advance(plan, tokens, np.ones(plan.num_decodes, np.int32))
    assert spec_replays > 10
    assert worst < 1e-4, worst


def _varied_prompts(prompt_lens=PROMPT_LENS):
    rng = np.random.default_rng(0)
    return [(rng.integers(3, 40000, plen).tolist(), max_tokens)
            for plen, max_tokens in zip(prompt_lens, MAX_TOKENS, strict=True)]


def _submit_varied(runner, sched, prompt_lens=PROMPT_LENS):
    from lightspeed_scheduler import RequestSpec

    for i, (prompt, max_tokens) in enumerate(_varied_prompts(prompt_lens)):
        spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        rid = sched.submit(RequestSpec(rid=f"r{i}", token_ids=prompt, max_new_tokens=max_tokens, ignore_eos=True))
        runner.add_request(rid, spec, prompt)


@pytest.fixture(scope="module")
def long_tiny_model_dir(tmp_path_factory):
    """The tiny Llama with room for 2048 positions, so graphs get a page table several splits wide."""
    import json

    from conftest_models import TINY_LLAMA

    folder = tmp_path_factory.mktemp("tiny-llama-2k")
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, "max_position_embeddings": 2048}))
    return str(folder)


def _gpu_engine(model_dir, **overrides):
    settings = {"device": "cuda", "max_num_seqs": 16, "max_model_len": 2048, "kv_cache_memory": "256MiB",
                "cuda_graph_max_batch_size": 16, **overrides}
    return _engine(model_dir, **settings)


@gpu
@pytest.mark.parametrize(("dtype", "kv_cache_dtype", "rel_tol"),
                         [("float32", "auto", 1e-3), ("bfloat16", "auto", 3e-2), ("bfloat16", "fp8", 1e-1)])
def test_graph_replay_equals_eager_forward(long_tiny_model_dir, dtype, kv_cache_dtype, rel_tol):
    """Every decode-only step runs eagerly and from its graph on the same cache; the logits must agree.

    max_model_len 2048 gives the graphs a 128-page table (8 attention splits of 256 keys) while the
    eager plans' tables are a few pages wide (one or two splits): the splits past each seq_len must be
    masked, and one sequence crosses a split boundary (fp32 then differs by the tf32 p@V rounding)."""
    runner, sched = _gpu_engine(long_tiny_model_dir, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    assert runner.graphs is not None, "CUDA graph capture failed: see the lightspeed.runner warning in the log"
    assert runner.graphs.batch_sizes == [1, 2, 4, 8, 16]
    _submit_varied(runner, sched, LONG_PROMPT_LENS)
    rows, sizes_used, argmax_agree, argmax_total = [], set(), 0, 0
    while sched.has_unfinished():
        plan = sched.next_plan()
        runner._bind_new_rows(plan)
        assert not plan.has_copies  # no host tier
        if plan.input_ids.shape[0] == 0:
            sched.advance(plan, [])
            continue
        t = runner.inputs.build(plan, runner._prev_sampled)
        eager = runner.forward_eager(plan, t).clone()
        logits = eager
        if runner.graphs.can_run(plan):
            n = plan.input_ids.shape[0]
            logits = runner.graphs.forward(plan, t).clone()
            diff = (logits - eager).abs().max().item()
            scale = max(1.0, eager.abs().max().item())
            agree = int((logits.argmax(-1) == eager.argmax(-1)).sum().item())
            argmax_agree, argmax_total = argmax_agree + agree, argmax_total + n
            rows.append((n, runner.graphs.padded_size(n), int(plan.seq_lens.max()), diff, diff / scale))
            sizes_used.add(runner.graphs.padded_size(n))
            assert torch.isfinite(logits).all()
        sched.advance(plan, runner.collect(runner._sample(plan, logits, t)).tokens)
    torch.cuda.synchronize()
    worst = max(rows, key=lambda r: r[4])
    print(f"\n{dtype}/{kv_cache_dtype}: {len(rows)} graph steps, sizes {sorted(sizes_used)}, "
          f"worst rel diff {worst[4]:.2e} (batch {worst[0]} padded to {worst[1]}, max seq_len {worst[2]}, "
          f"max abs diff {worst[3]:.3e}); argmax agreement {argmax_agree}/{argmax_total}")
    for n, size, max_len, diff, rel in rows[:: max(1, len(rows) // 12)]:
        print(f"  batch {n:2d} -> graph {size:2d}  max seq_len {max_len:3d}  max abs diff {diff:.3e}  rel {rel:.2e}")
    assert sizes_used == {1, 2, 4, 8, 16}, f"graph sizes exercised: {sorted(sizes_used)}"
    assert any(r[0] != r[1] for r in rows), "no padded batch was replayed"
    bad = [r for r in rows if r[4] > rel_tol]
    assert not bad, f"graph vs eager logits beyond rel {rel_tol}: {bad[:5]}"
    if dtype == "float32":
        assert argmax_agree >= 0.99 * argmax_total


@gpu
@pytest.mark.parametrize("speculative_config", [
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
    {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
    {"method": "eagle3", "num_speculative_tokens": 3},
], ids=["ngram", "ngram_gpu", "eagle3"])
def test_speculative_engine_with_graphs_generates_what_eager_does(long_tiny_model_dir, tmp_path,
                                                                   speculative_config):
    """Speculative steps replayed from the k + 1 token graphs (and a device drafter reading the
    graphs' hidden states): the same greedy tokens as eager without speculation."""
    from lightspeed.models import ModelConfig
    from spec_helpers import write_random_eagle3_head

    if speculative_config["method"] == "eagle3":
        head = write_random_eagle3_head(tmp_path / "head", ModelConfig.from_pretrained(long_tiny_model_dir))
        speculative_config = {**speculative_config, "model": str(head)}
    outputs = {}
    for eager, spec in ((True, None), (False, speculative_config)):
        engine = make_engine(long_tiny_model_dir, device="cuda", dtype="float32", enforce_eager=eager,
                             speculative_config=spec, max_num_seqs=16, max_model_len=2048, kv_cache_memory="256MiB",
                             cuda_graph_max_batch_size=16)
        for i, (prompt, max_tokens) in enumerate(_varied_prompts()):
            submit(engine, f"r{i}", prompt * 2, SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        outputs[eager] = run_until_idle(engine).tokens
        if not eager:
            assert engine.runner.graphs is not None and engine.runner.graphs.num_replays > 0
            assert engine.stats().spec_num_draft_tokens > 0
    assert outputs[False] == outputs[True]


@gpu
def test_engine_with_graphs_generates_what_eager_does(long_tiny_model_dir):
    """The whole engine step, synchronous and overlapped (deferred inputs), fp32: same greedy tokens."""
    outputs = {}
    for eager in (True, False):
        for overlap in (False, True):
            engine = make_engine(long_tiny_model_dir, device="cuda", dtype="float32", enforce_eager=eager,
                                 async_scheduling=overlap, max_num_seqs=16, max_model_len=2048,
                                 kv_cache_memory="256MiB", cuda_graph_max_batch_size=16)
            graphs = engine.runner.graphs
            assert (graphs is None) == eager, "CUDA graph capture failed: see the warning in the log"
            for i, (prompt, max_tokens) in enumerate(_varied_prompts()):
                submit(engine, f"r{i}", prompt, SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
            run = run_until_idle(engine)
            assert (run.overlapped_steps > 0) == overlap
            outputs[eager, overlap] = run.tokens
            if not eager:
                assert graphs.num_replays > 0
                print(f"\noverlap={overlap}: {graphs.num_replays} graph replays")
    reference = outputs[True, False]
    assert len(reference) == len(PROMPT_LENS)
    for key, out in outputs.items():
        assert out == reference, f"{key} differs from eager sync"
