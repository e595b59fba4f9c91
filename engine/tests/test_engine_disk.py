"""The disk KV tier in the engine: a prefix evicted from device and host comes back from disk with
the same greedy output, a restarted engine finds it, a corrupted or truncated file is detected and
ignored (the pages are recomputed), and a full disk stops the tier's writes while serving goes on."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.config import EngineConfig
from lightspeed.core.messages import SamplingSpec
from lightspeed.kv.disk import entry_dtype

GREEDY = SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
SMOLLM2_PAGE = 737_280  # bytes of one 16-token page of SmolLM2-135M in fp32 (30 layers, 3 KV heads of 64)


def smollm2(model_path: str, cache_dir) -> object:
    # 17 device pages hold one conversation (11 pages) and a half, 11 host pages one: the prefix of a
    # conversation two others came after is on disk only (and the host has room to read it through).
    return make_engine(model_path, load_format="auto", kv_cache_memory=18 * SMOLLM2_PAGE,
                       host_cache_memory=12 * SMOLLM2_PAGE, max_num_seqs=2, max_model_len=256,
                       disk_cache_dir=str(cache_dir), disk_cache_size="64MiB")


def ask(engine, name: str, prompt: list[int], spec: SamplingSpec = GREEDY):
    submit(engine, name, prompt, spec)
    run = run_until_idle(engine)
    return run.tokens[name], run.cached[name], run.cached_by_tier[name]


def corrupt_record(cache_dir, record_bytes: int, page_size: int, tokens: list[int]) -> None:
    """Flip one payload byte of the record holding the page `tokens`."""
    (index_path,) = cache_dir.glob("*.index")
    entries = np.fromfile(index_path, entry_dtype(page_size), offset=4096)
    (slot,) = np.flatnonzero((entries["tokens"] == np.array(tokens)).all(axis=1))
    with open(next(cache_dir.glob("*.data")), "r+b") as f:
        f.seek(int(slot) * record_bytes + 1000)
        byte = f.read(1)[0]
        f.seek(int(slot) * record_bytes + 1000)
        f.write(bytes([byte ^ 0x01]))


def test_disk_tier_serves_evicted_prefixes_across_restarts_and_never_a_bad_record(default_model_path, tmp_path):
    rng = random.Random(0)
    first, other, third = ([rng.randrange(100, 40000) for _ in range(160)] for _ in range(3))
    # Life 1: the first conversation is pushed off device and host by two others, then comes back.
    engine = smollm2(default_model_path, tmp_path)
    out1, _, _ = ask(engine, "a", first)
    ask(engine, "b", other)
    ask(engine, "c", third)
    again, cached, by_tier = ask(engine, "a-again", first)
    assert by_tier == [0, 0, 144] and cached == 144, "all 9 matchable pages from disk, none from device or host"
    assert again == out1, "the KV read from disk gives the same greedy tokens"
    stats = engine.stats()
    assert stats.disk_hit_tokens == 144 and stats.disk_bytes_read == 9 * SMOLLM2_PAGE
    record_bytes = engine.disk.record_bytes
    engine.drain_copies()  # shutdown
    # Life 2: the second turn of the first conversation finds the first turn on disk.
    turn2 = first + out1 + [rng.randrange(100, 40000) for _ in range(40)]
    engine = smollm2(default_model_path, tmp_path)
    assert engine.disk.stats.restored_pages == 30  # 3 conversations of 10 full pages
    out2, cached, by_tier = ask(engine, "turn2", turn2)
    assert cached >= 160 and by_tier[2] == cached, "cached_tokens covers the first turn, from disk"
    engine.drain_copies()
    # Life 3: a bit flipped in the third page's record: detected, that page and the rest recomputed.
    corrupt_record(tmp_path, record_bytes, 16, first[32:48])
    engine = smollm2(default_model_path, tmp_path)
    out3, cached, by_tier = ask(engine, "turn2-again", turn2)
    assert by_tier == [0, 0, 32] and cached == 32
    assert engine.stats().disk_read_failures == 1 and engine.disk.stats.failures_by_reason == {"checksum": 1}
    assert out3 == out2
    engine.scheduler.check_invariants()
    engine.drain_copies()


def tiny(model_dir: str, cache_dir, **overrides):
    settings = dict(kv_cache_memory=24 * 8192, host_cache_memory=16 * 8192, max_num_seqs=2,
                    disk_cache_dir=str(cache_dir), disk_cache_size="2MiB")
    return make_engine(model_dir, **{**settings, **overrides})


def test_restart_finds_the_prefix_and_a_truncated_file_loses_only_its_tail(tiny_model_dir, tmp_path):
    prompt = list(range(10, 170))
    engine = tiny(tiny_model_dir, tmp_path)
    out, _, _ = ask(engine, "a", prompt)
    record_bytes = engine.disk.record_bytes
    engine.drain_copies()
    (index_path,) = tmp_path.glob("*.index")
    entries = np.fromfile(index_path, entry_dtype(16), offset=4096)
    depth_of = {int(s): int(d) for s, d in zip(np.flatnonzero(entries["magic"]), entries["depth"][entries["magic"] != 0],
                                               strict=True)}
    assert sorted(depth_of.values()) == list(range(1, 11))  # 167 tokens of KV: 10 full pages
    engine = tiny(tiny_model_dir, tmp_path)
    assert engine.disk.stats.restored_pages == 10
    again, cached, by_tier = ask(engine, "a", prompt)
    assert (cached, by_tier, again) == (144, [0, 0, 144], out)
    engine.drain_copies()
    # Cut the data file inside the record of depth 5: it and every page below it are gone.
    slot5 = next(s for s, d in depth_of.items() if d == 5)
    os.truncate(next(tmp_path.glob("*.data")), slot5 * record_bytes + 10)
    engine = tiny(tiny_model_dir, tmp_path)
    assert engine.disk.stats.restored_pages == sum(1 for s, d in depth_of.items() if d < 5 and s < slot5)
    engine.drain_copies()


def test_a_foreign_model_never_reads_the_files(tiny_model_dir, tmp_path):
    engine = tiny(tiny_model_dir, tmp_path)
    ask(engine, "a", list(range(10, 170)))
    engine.drain_copies()
    engine = tiny(tiny_model_dir, tmp_path, seed=1)  # other dummy weights: another fingerprint
    assert engine.disk.stats.restored_pages == 0 and len(list(tmp_path.glob("*.data"))) == 2
    engine.drain_copies()


_FULL_DISK = textwrap.dedent("""
    import json, resource, sys
    sys.path.insert(0, {tests!r})
    from engine_driver import make_engine, run_until_idle, submit
    from lightspeed.core.messages import SamplingSpec
    spec = SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True)
    settings = dict(kv_cache_memory=24 * 8192, host_cache_memory=16 * 8192, max_num_seqs=2)
    engine = make_engine({model!r}, disk_cache_dir={cache!r}, disk_cache_size="2MiB", **settings)
    # Files may not grow past 4 records (slots 1..3): later writes fail as on a full disk (EFBIG).
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 * engine.disk.record_bytes, resource.RLIM_INFINITY))
    outs = {{}}
    for i in range(4):
        submit(engine, f"p{{i}}", list(range(10 + 200 * i, 170 + 200 * i)), spec)
        outs[f"p{{i}}"] = run_until_idle(engine).tokens[f"p{{i}}"]
    submit(engine, "again", list(range(10, 170)), spec)
    run = run_until_idle(engine)
    stats = engine.stats()
    result = dict(outs=outs, again=run.tokens["again"], cached=run.cached_by_tier["again"],
                  stopped=engine.scheduler.stats()["disk_writes_stopped"], errors=stats.disk_write_errors,
                  written=stats.disk_bytes_written // engine.disk.payload_bytes)
    engine.drain_copies()
    reference = make_engine({model!r}, **settings)
    for name, prompt in (("p0", list(range(10, 170))), ("p3", list(range(610, 770)))):
        submit(reference, name, prompt, spec)
        result["reference_" + name] = run_until_idle(reference).tokens[name]
    print(json.dumps(result))
""")


def test_full_disk_stops_writes_and_serving_goes_on(tiny_model_dir, tmp_path):
    script = _FULL_DISK.format(tests=os.path.dirname(__file__), model=tiny_model_dir, cache=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stopped"] and result["errors"] >= 1 and result["written"] == 3
    assert all(len(t) == 6 for t in result["outs"].values()), "every request completed"
    assert result["outs"]["p0"] == result["reference_p0"] and result["outs"]["p3"] == result["reference_p3"]
    assert result["again"] == result["outs"]["p0"]
    assert result["cached"][2] == 48, "the three records written before the disk filled still serve"
    assert "writes stopped" in done.stderr


@pytest.mark.parametrize("settings, message", [
    (dict(disk_cache_size="1GiB"), "needs a positive size and a disk_cache_dir"),
    (dict(disk_cache_dir="/tmp/x", host_cache_memory=0), "needs the host tier"),
    (dict(disk_cache_dir="/tmp/x", disk_cache_size="0"), "positive size"),
])
def test_config_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_cli(**settings)


@pytest.mark.gpu
def test_gpu_disk_tier_round_trip_and_restart(tiny_model_dir, tmp_path):
    """On CUDA: pages read from disk into the pinned host pool and loaded by the copy stream give the
    tokens a full recompute gives, in the same engine and after a restart."""
    page = 4096  # the tiny model's 16-token page in bf16
    settings = dict(device="cuda", dtype="bfloat16", kv_cache_memory=18 * page, host_cache_memory=12 * page)
    prompts = [list(range(10 + 200 * i, 170 + 200 * i)) for i in range(3)]
    engine = tiny(tiny_model_dir, tmp_path, **settings)
    outs = [ask(engine, f"p{i}", p)[0] for i, p in enumerate(prompts)]
    again, cached, by_tier = ask(engine, "again", prompts[0])
    assert by_tier == [0, 0, 144] and again == outs[0]
    engine.drain_copies()
    engine = tiny(tiny_model_dir, tmp_path, **settings)
    restarted, cached, by_tier = ask(engine, "restarted", prompts[1])
    assert by_tier == [0, 0, 144] and restarted == outs[1]
    engine.drain_copies()
