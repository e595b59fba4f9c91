"""Piecewise CUDA graphs of prefill and mixed steps (runner/piecewise_graph.py): the split at
attention and the size rule on the CPU; replay == eager on the GPU (`-m gpu`)."""

import json

import numpy as np
import pytest
import torch
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec
from lightspeed.layers.attention import PIECEWISE_SPLIT, AttentionMetadata
from lightspeed.runner.piecewise_graph import TOKEN_SIZES, PiecewiseGraphRunner, auto_max_tokens

gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def long_tiny_model_dir(tmp_path_factory):
    from conftest_models import TINY_LLAMA

    folder = tmp_path_factory.mktemp("tiny-llama-2k")
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, "max_position_embeddings": 2048}))
    return str(folder)


def test_every_layer_splits_once_at_its_attention_and_the_rest_is_per_token(tiny_model_dir):
    """Run the forward the way capture cuts it (CPU: no graphs, the split only), then attend each
    layer between the pieces on the real metadata: the same hidden states as the plain forward."""
    engine = make_engine(tiny_model_dir, device="cpu", dtype="float32", enforce_eager=True)
    runner = engine.runner
    model, pool = runner.model, runner.kv_cache.device_pool
    layers = model.config.num_hidden_layers
    pw = PiecewiseGraphRunner(model, runner.kv_cache, sizes=[16], num_layers=layers, device=torch.device("cpu"))
    pieces = pw._run(16, capture=False, pool=None)
    assert len(pieces.layers) == layers and not pieces.graphs
    assert [layer.layer_idx for layer in pieces.layers] == list(range(layers))

    # What the split leaves out, done by hand: one prefill row of 11 tokens, padded to 16.
    n = 11
    ids = torch.randint(3, model.config.vocab_size, (n,))
    pos = torch.arange(n)
    slots = torch.arange(n, dtype=torch.int64) + pool.layout.page_size  # page 1
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, n], dtype=torch.int32), seq_lens=torch.tensor([n], dtype=torch.int32),
        page_table=torch.tensor([[1]], dtype=torch.int32), slot_mapping=slots, num_decodes=0, num_decode_tokens=0,
        max_query_len=n, kv_caches=pool.kv_caches, k_scale=pool.k_scale, v_scale=pool.v_scale)
    expected = model(ids, pos, meta).clone()

    calls = []

    def split(layer, q):
        # A replay: the piece ends copying q into the query buffer, then this layer's attention runs on
        # the step's n tokens, query buffer to output buffer.
        query, out = pw.attention_buffers(q)
        query.copy_(q)
        layer.attend(query[:n], meta, out=out[:n])
        calls.append(layer.layer_idx)
        return out

    pw.input_ids[:n], pw.positions[:n], pw.slot_mapping[:n] = ids, pos, slots
    pw.slot_mapping[n:16] = -1
    pad_meta = AttentionMetadata(
        query_start_loc=meta.query_start_loc, seq_lens=meta.seq_lens, page_table=meta.page_table,
        slot_mapping=pw.slot_mapping[:16], num_decodes=0, num_decode_tokens=0, max_query_len=16,
        kv_caches=pool.kv_caches, k_scale=pool.k_scale, v_scale=pool.v_scale)
    pad_meta.scratch[PIECEWISE_SPLIT] = split
    got = model(pw.input_ids[:16], pw.positions[:16], pad_meta)[:n]
    assert calls == list(range(layers))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_attention_buffers_are_shared_and_reject_other_shapes(tiny_model_dir):
    engine = make_engine(tiny_model_dir, device="cpu", dtype="float32", enforce_eager=True)
    pw = PiecewiseGraphRunner(engine.runner.model, engine.runner.kv_cache, sizes=[32, 16], num_layers=1,
                              device=torch.device("cpu"))
    assert pw.sizes == [16, 32] and pw.max_tokens == 32
    (qa, a), (qb, b) = pw.attention_buffers(torch.zeros(16, 4, 8)), pw.attention_buffers(torch.zeros(32, 4, 8))
    assert a.data_ptr() == b.data_ptr() and qa.data_ptr() == qb.data_ptr() != a.data_ptr()
    assert b.shape == qb.shape == (32, 4, 8)
    with pytest.raises(ValueError, match="differ in shape"):
        pw.attention_buffers(torch.zeros(16, 2, 8))
    with pytest.raises(ValueError, match="positive"):
        PiecewiseGraphRunner(engine.runner.model, engine.runner.kv_cache, sizes=[], num_layers=1,
                             device=torch.device("cpu"))


def test_auto_size_keeps_graphs_to_host_bound_steps():
    """A small model's steps are host-bound up to thousands of tokens; an 8B model's only up to a few
    dozen (above that the GPU's GEMM time exceeds the eager host time, and padding would cost)."""

    class Fake(torch.nn.Module):
        def __init__(self, weights: int):
            super().__init__()
            self.embed_tokens = torch.nn.Parameter(torch.empty(10**6, device="meta"))
            self.w = torch.nn.Parameter(torch.empty(weights, device="meta"))

    small, big = auto_max_tokens(Fake(106 * 10**6), 30, 8192), auto_max_tokens(Fake(7 * 10**9), 32, 8192)
    assert 4096 <= small <= 8192 and 16 <= big < 256
    assert auto_max_tokens(Fake(10**3), 2, 512) == 512  # capped by the step's token budget
    assert min(TOKEN_SIZES) == 16 and list(TOKEN_SIZES) == sorted(TOKEN_SIZES)


def test_cpu_engines_have_no_piecewise_graphs(tiny_model_dir):
    assert make_engine(tiny_model_dir, device="cpu").runner.piecewise is None


def _arrive(engine, pending: list, steps: int) -> None:
    """Request i arrives at step 2i."""
    while pending and pending[0][0] * 2 <= steps:
        i, prompt = pending.pop(0)
        submit(engine, f"r{i}", prompt, SamplingSpec(max_tokens=20 + i, temperature=0.0, ignore_eos=True))


@gpu
@pytest.mark.parametrize("overlap,spec", [
    (False, None), (True, None),
    (True, {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_min": 1}),
], ids=["sync", "overlap", "overlap-ngram_gpu"])
def test_piecewise_engine_generates_what_eager_does(long_tiny_model_dir, overlap, spec):
    """Prefill chunks and mixed steps through the piecewise graphs (arrivals staggered so decode rows,
    speculative ones too, share steps with prefills), fp32: the same greedy tokens as a fully eager
    engine without speculation."""
    rng = np.random.default_rng(0)
    # Prompts repeat a phrase, so a drafter finds matches.
    prompts = [(rng.integers(3, 40000, 7).tolist() * 100)[:n] for n in (1, 15, 17, 40, 90, 250, 333, 600, 5, 64)]
    outputs, replays = {}, 0
    for eager in (True, False):
        engine = make_engine(long_tiny_model_dir, device="cuda", dtype="float32", enforce_eager=eager,
                             async_scheduling=overlap, speculative_config=None if eager else spec, max_num_seqs=16, max_model_len=2048, kv_cache_memory="256MiB",
                             max_num_batched_tokens=512, chunked_prefill_size=256, cuda_graph_max_batch_size=16)
        assert (engine.runner.piecewise is None) == eager, "piecewise capture failed: see the warning in the log"
        pending = list(enumerate(prompts))
        _arrive(engine, pending, 0)
        run = run_until_idle(engine, on_step=lambda engine, run, pending=pending: _arrive(engine, pending, run.steps))
        outputs[eager] = run.tokens
        if not eager:
            replays = engine.runner.piecewise.num_replays
    assert replays > 0
    assert outputs[False] == outputs[True]


def test_size_limit_follows_config_and_skips_mla(tiny_model_dir):
    """`_piecewise_max_tokens` (also what the KV budget reserves for): the auto limit capped by the step's
    token budget, 0 when turned off, eager, on CPU, or for MLA attention (which does not split)."""
    from lightspeed.config import EngineConfig
    from lightspeed.runner.factory import _piecewise_max_tokens

    cuda = torch.device("cuda")  # only its type is read
    llama = make_engine(tiny_model_dir, device="cpu").runner.model
    layers = llama.config.num_hidden_layers
    assert _piecewise_max_tokens(EngineConfig(max_num_batched_tokens=512), None, llama, layers, cuda) == 512
    assert _piecewise_max_tokens(EngineConfig(piecewise_cuda_graph_max_tokens=100), None, llama, layers, cuda) == 100
    for config in (EngineConfig(piecewise_cuda_graph_max_tokens=0), EngineConfig(enforce_eager=True)):
        assert _piecewise_max_tokens(config, None, llama, layers, cuda) == 0
    assert _piecewise_max_tokens(EngineConfig(), None, llama, layers, torch.device("cpu")) == 0
    deepseek = make_engine("tiny-deepseek-v3", device="cpu").runner.model
    assert _piecewise_max_tokens(EngineConfig(), None, deepseek, deepseek.config.num_hidden_layers, cuda) == 0
    with pytest.raises(ValueError, match="piecewise_cuda_graph_max_tokens"):
        EngineConfig(piecewise_cuda_graph_max_tokens=-1)
