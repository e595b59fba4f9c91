"""Tensor, expert and sequence parallelism over 2 ranks (torch.distributed's gloo backend on CPU)
give the logits of the unsharded model: within 1e-5 of our own single-rank model (relative to the
largest logit, fp32) and within 1e-4 of transformers. Covers uneven head splits (SmolLM2's 9 query
/ 3 KV heads), a vocabulary that does not split, replicated KV heads, MoE experts sliced (TP) or
whole (EP, replicated tokens or token shards exchanged by all-to-all) and data-parallel attention
whose two ranks run different requests through one expert-parallel MoE."""

from __future__ import annotations

import multiprocessing as mp
import random
import socket
from unittest import mock

import pytest
import torch
from conftest_models import (
    PagedKV,
    PagedMLA,
    Row,
    assert_close_rel,
    hf_logits,
    hf_reference_model,
    single_thread,  # noqa: F401  (fixture used by pytestmark)
)
from lightspeed.layers import ParallelContext, ParallelLayout, expert_parallel
from lightspeed.loader import load_model

pytestmark = pytest.mark.usefixtures("single_thread")

WORLD = 2
MODELS = {
    # preset, overrides: odd vocabulary (padded LM head shard); SmolLM2's head counts (3 KV heads
    # over 2 ranks: 2 + 1, with 6 + 3 query heads); one KV head replicated on both ranks.
    "llama-odd-vocab": ("tiny-llama", {"vocab_size": 255}),
    "smollm2-heads": ("tiny-llama", {"hidden_size": 144, "num_attention_heads": 9, "num_key_value_heads": 3}),
    "qwen3-moe": ("tiny-qwen3-moe", {"num_key_value_heads": 1}),
    "deepseek-v3": ("tiny-deepseek-v3", {}),
}
# layout name -> which models run it
LAYOUTS = {
    "tp": ["llama-odd-vocab", "smollm2-heads", "qwen3-moe", "deepseek-v3"],
    "ep": ["qwen3-moe", "deepseek-v3"],            # whole experts, every rank sees every token
    "ep-sp": ["qwen3-moe", "deepseek-v3"],         # sequence-sharded stream, experts by all-to-all
    "sp": ["qwen3-moe"],                           # sequence-sharded stream, tensor-parallel experts
    "dp-ep": ["qwen3-moe", "deepseek-v3"],         # attention DP 2 (one request per rank), MoE EP 2
    # The same two, exchanging tokens the way CUDA-graph capture does (all-gather + reduce-scatter
    # over shards padded to one size: the ranks agree on the step's largest token count).
    "ep-sp-gather": ["qwen3-moe"],
    "dp-ep-gather": ["deepseek-v3"],
}


def _layout(name: str, rank: int) -> ParallelLayout:
    name = name.removesuffix("-gather")
    ctx = ParallelContext(rank, WORLD)
    if name == "dp-ep":
        return ParallelLayout(ParallelContext(), ParallelContext(), ctx, expert_parallel=True)
    return ParallelLayout(ctx, ctx, ctx, expert_parallel=name.startswith("ep"), sequence_parallel=name.endswith("sp"))


def _requests(vocab: int) -> dict[str, list[int]]:
    rng = random.Random(0)
    return {"a": [rng.randrange(vocab) for _ in range(9)], "b": [rng.randrange(vocab) for _ in range(6)]}


def _steps(requests: dict[str, list[int]], names: list[str]) -> list[list[Row]]:
    """A prefill chunk per request, then a 2-token decode for "a" and a 1-token decode for "b"."""
    split = {"a": 7, "b": 5}
    return [[Row(n, requests[n][: split[n]]) for n in names], [Row(n, requests[n][split[n]:], True) for n in names]]


def _run(model, config, steps: list[list[Row]], tp_size: int, rank: int, pad_to: list[int] | None = None
         ) -> dict[str, torch.Tensor]:
    if config.mla is not None:
        kv = PagedMLA(config)
    else:
        kv = PagedKV(config, tp_size=tp_size, tp_rank=rank)
    logits: dict[str, list[torch.Tensor]] = {}
    for i, rows in enumerate(steps):
        model.model.tokens.pad_to = pad_to[i] if pad_to else None
        for row, out in zip(rows, kv.step(model, rows), strict=True):
            logits.setdefault(row.request, []).append(out)
    return {name: torch.cat(parts) for name, parts in logits.items()}


def _worker(rank: int, port: int, model_dirs: dict[str, str], out_path: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=WORLD)
    results = {}
    try:
        for layout_name, cases in LAYOUTS.items():
            layout = _layout(layout_name, rank)
            for case in cases:
                model, config = load_model(model_dirs[case], dtype=torch.float32, parallel=layout, progress=False)
                requests = _requests(config.vocab_size)
                # data-parallel attention: each rank serves its own request
                names = [sorted(requests)[rank]] if layout_name == "dp-ep" else sorted(requests)
                tp = layout.attention.tp_size
                steps = _steps(requests, names)
                gather = layout_name.endswith("-gather")
                pad_to = [7, 2] if gather else None  # the larger rank's token count of each step
                with mock.patch.object(expert_parallel, "_capturing", lambda device, gather=gather: gather):
                    results[(layout_name, case, rank)] = _run(model, config, steps, tp, rank % tp, pad_to)
                results[("shard_rows", layout_name, case, rank)] = model.model.embed_tokens.weight.shape[0]
        gathered = [None] * WORLD
        torch.distributed.all_gather_object(gathered, results)
        if rank == 0:
            torch.save({k: v for part in gathered for k, v in part.items()}, out_path)
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_parallel_layouts_match_one_rank_and_transformers(tmp_path):
    references, model_dirs = {}, {}
    for case, (preset, overrides) in MODELS.items():
        references[case] = hf_reference_model(preset, seed=11, **overrides)
        model_dirs[case] = str(tmp_path / case)
        references[case].save_pretrained(model_dirs[case])
    out_path = tmp_path / "results.pt"
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, model_dirs, str(out_path))) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0, f"parallel worker exited with {p.exitcode}"
    results = torch.load(out_path)
    for case, hf in references.items():
        model, config = load_model(model_dirs[case], dtype=torch.float32, progress=False)
        requests = _requests(config.vocab_size)
        one_rank = _run(model, config, _steps(requests, sorted(requests)), 1, 0)
        assert results[("shard_rows", "tp", case, 1)] == -(-config.vocab_size // WORLD)  # half the vocabulary
        for layout_name, cases in LAYOUTS.items():
            if case not in cases:
                continue
            for rank in range(WORLD):
                for name, logits in results[(layout_name, case, rank)].items():
                    what = f"{layout_name} {case} rank {rank} request {name}"
                    assert_close_rel(logits, one_rank[name], rel=1e-5, what=f"{what} vs one rank")
                    assert_close_rel(logits, hf_logits(hf, requests[name]), rel=1e-4, what=f"{what} vs transformers")
