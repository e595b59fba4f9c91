"""Tensor parallelism (tp=2 over torch.distributed's gloo backend on CPU) gives the logits of
the unsharded model: column/row-parallel linears, vocab-parallel embedding and LM head (with a
vocabulary that does not split evenly), KV heads split or replicated, MoE experts sharded."""

from __future__ import annotations

import multiprocessing as mp
import random
import socket

import torch
from conftest_models import PagedKV, Row, assert_close_rel, hf_logits, hf_reference_model
from lightspeed.layers import ParallelContext
from lightspeed.loader import load_model

TP = 2
CASES = {
    # preset, overrides: odd vocabulary (padded LM head shard); one KV head replicated on both ranks.
    "llama-odd-vocab": ("tiny-llama", {"vocab_size": 255}),
    "qwen3-moe-replicated-kv": ("tiny-qwen3-moe", {"num_key_value_heads": 1}),
}


def _rows(vocab: int) -> tuple[list[list[Row]], dict[str, list[int]]]:
    rng = random.Random(0)
    a, b = [rng.randrange(vocab) for _ in range(9)], [rng.randrange(vocab) for _ in range(6)]
    steps = [[Row("a", a[:7]), Row("b", b[:5])], [Row("a", a[7:], True), Row("b", b[5:], True)]]
    return steps, {"a": a, "b": b}


def _worker(rank: int, port: int, model_dirs: dict[str, str], out_path: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP)
    results = {}
    try:
        for case, model_dir in model_dirs.items():
            model, config = load_model(model_dir, dtype=torch.float32, parallel=ParallelContext(rank, TP),
                                       progress=False)
            kv = PagedKV(config, tp_size=TP)
            steps, _ = _rows(config.vocab_size)
            logits = {}
            for rows in steps:
                for row, out in zip(rows, kv.step(model, rows), strict=True):
                    logits.setdefault(row.request, []).append(out)
            results[case] = {"logits": {k: torch.cat(v) for k, v in logits.items()},
                             "shard_rows": model.model.embed_tokens.weight.shape[0]}
        if rank == 0:
            torch.save(results, out_path)
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tp2_matches_transformers(tmp_path):
    references, model_dirs = {}, {}
    for case, (preset, overrides) in CASES.items():
        references[case] = hf_reference_model(preset, seed=11, **overrides)
        model_dirs[case] = str(tmp_path / case)
        references[case].save_pretrained(model_dirs[case])
    out_path = tmp_path / "rank0.pt"
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, model_dirs, str(out_path))) for r in range(TP)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
        assert p.exitcode == 0, f"tp worker exited with {p.exitcode}"
    results = torch.load(out_path)
    for case, hf in references.items():
        assert results[case]["shard_rows"] == -(-hf.config.vocab_size // TP)  # half the vocabulary per rank
        _, seqs = _rows(hf.config.vocab_size)
        for name, tokens in seqs.items():
            assert_close_rel(results[case]["logits"][name], hf_logits(hf, tokens), what=f"tp={TP} {case} {name}")
