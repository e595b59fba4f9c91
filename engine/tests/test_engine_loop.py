"""The engine's one step loop: overlapped == synchronous token for token, asynchronous KV tiers
(write-through, load-back, idle flush, tier off), aborts mid-flight."""

import pytest
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec

GREEDY = SamplingSpec(max_tokens=10, temperature=0.0, ignore_eos=True)
PROMPTS = [list(range(3, 40)), list(range(100, 105)), list(range(7, 90))]


def _run(engine, prompts, spec=GREEDY, prefix="r"):
    for i, prompt in enumerate(prompts):
        submit(engine, f"{prefix}{i}", prompt, spec)
    return run_until_idle(engine)


def test_batched_chunked_equals_alone(tiny_model_dir):
    batched = _run(make_engine(tiny_model_dir, chunked_prefill_size=16, max_num_batched_tokens=32), PROMPTS)
    for i, prompt in enumerate(PROMPTS):
        alone = _run(make_engine(tiny_model_dir), [prompt])
        assert alone.tokens["r0"] == batched.tokens[f"r{i}"]
        assert len(batched.tokens[f"r{i}"]) == 10 and batched.finished[f"r{i}"] == "length"


def _conversation(engine, sampling, turns=2):
    """A shared system prompt, three users, turns that extend the previous turn: prefix hits."""
    system = list(range(200, 260))
    outputs, overlapped = {}, 0
    for turn in range(turns):
        for user in range(3):
            history = outputs.get(user, system + [1000 + user] * 5)
            name = f"u{user}t{turn}"
            submit(engine, name, history, sampling)
        run = run_until_idle(engine)
        overlapped += run.overlapped_steps
        for user in range(3):
            name = f"u{user}t{turn}"
            history = outputs.get(user, system + [1000 + user] * 5)
            outputs[user] = history + run.tokens[name] + [2000 + turn] * 7
            assert run.finished[name] == "length"
    assert (overlapped > 0) == engine.config.async_scheduling
    return outputs


@pytest.mark.parametrize("host_cache_memory, sampling", [
    ("24MiB", SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True)),
    (0, SamplingSpec(max_tokens=6, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)),
], ids=["greedy-host-tier", "seeded-no-host-tier"])
def test_overlapped_loop_matches_synchronous(default_model_path, host_cache_memory, sampling):
    """SmolLM2 (real weights): multi-turn conversations with prefix hits, token for token."""
    settings = dict(load_format="auto", kv_cache_memory="48MiB", host_cache_memory=host_cache_memory,
                    max_model_len=256, chunked_prefill_size=32, max_num_batched_tokens=64)
    sync = _conversation(make_engine(default_model_path, async_scheduling=False, **settings), sampling)
    overlapped_engine = make_engine(default_model_path, async_scheduling=True, **settings)
    assert _conversation(overlapped_engine, sampling) == sync
    assert overlapped_engine.scheduler.stats()["prefix_hit_tokens"] > 0


def test_abort_mid_flight_matches_synchronous(tiny_model_dir):
    """Aborting a request while its next step is in flight voids its row; the others are untouched."""
    results = []
    for overlap in (False, True):
        engine = make_engine(tiny_model_dir, async_scheduling=overlap)
        for i, prompt in enumerate(PROMPTS):
            submit(engine, f"r{i}", prompt, SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True))

        def abort_after_three(engine, run):
            if len(run.tokens.get("r1", [])) == 3 and "r1" not in run.finished:
                engine.abort_requests(["r1"])

        run = run_until_idle(engine, on_step=abort_after_three)
        assert "r1" not in run.finished and len(run.tokens["r1"]) == 3
        assert engine.scheduler.stats()["free_device_pages"] + engine.scheduler.stats()["cached_device_pages"] == \
            engine.built.num_device_pages - 1
        results.append({k: v for k, v in run.tokens.items()})
    assert results[0] == results[1]


def test_host_tier_write_through_and_load_back_keep_outputs(tiny_model_dir):
    """A tiny device pool pushes prefixes off the device; their host copies (written in the background)
    serve the repeated prompt, which must give the same tokens as the first time."""
    engine = make_engine(tiny_model_dir, kv_cache_memory=48 * 4096, host_cache_memory=256 * 4096, max_num_seqs=2)
    first = list(range(10, 170))
    spec = SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True)
    loads, outs = 0, []
    for i, prompt in enumerate((first, list(range(300, 460)), list(range(600, 760)), first)):
        submit(engine, f"p{i}", prompt, spec)

        def count_loads(engine, run):
            nonlocal loads
            loads += engine.scheduler.stats()["num_loading"]

        run = run_until_idle(engine, on_step=count_loads)
        outs.append(run.tokens[f"p{i}"])
        stats = engine.scheduler.stats()
        assert stats["num_copy_batches"] == 0 and stats["num_writing_back"] == 0  # the idle flush landed them
    assert loads > 0, "the repeated prompt was not served from the host tier"
    assert run.cached["p3"] >= 144  # 9 of its 10 full pages came back from host
    assert outs[3] == outs[0]
    engine.scheduler.check_invariants()


def test_idle_engine_flushes_write_through(tiny_model_dir):
    """Pages a request completes in its last steps reach host with no further request arriving."""
    engine = make_engine(tiny_model_dir, max_num_seqs=2)
    submit(engine, "a", list(range(10, 74)), SamplingSpec(max_tokens=20, temperature=0.0, ignore_eos=True))
    run_until_idle(engine)
    stats = engine.scheduler.stats()
    # 64 prompt + 19 output tokens with KV = 83 tokens: 5 full pages of 16, all on host now.
    assert stats["cached_host_pages"] == 5 and not engine.has_pending_copies()


def test_host_tier_off_serves_and_never_copies(tiny_model_dir):
    engine = make_engine(tiny_model_dir, host_cache_memory=0, kv_cache_memory=48 * 4096, max_num_seqs=2)
    assert engine.runner.kv_cache.host_pool is None and engine.built.num_host_pages == 0
    run = _run(engine, [list(range(10, 170)), list(range(300, 460))])
    assert all(len(t) == 10 for t in run.tokens.values())
    assert engine.scheduler.stats()["cached_host_pages"] == 0


def test_start_up_warm_up_leaves_no_trace(tiny_model_dir):
    """The core's start-up warm-up request (run before Ready on GPUs) finishes, resets the counters,
    and changes nothing a later request sees: the same greedy tokens as an engine that never warmed up."""
    cold = _run(make_engine(tiny_model_dir), PROMPTS)
    engine = make_engine(tiny_model_dir)
    assert engine.warm_up() >= 0
    assert not engine.has_work() and not engine._ids
    stats = engine.stats()
    assert (stats.num_steps, stats.num_generated_tokens, stats.num_prefill_tokens) == (0, 0, 0)
    warm = _run(engine, PROMPTS)
    assert warm.tokens == cold.tokens and set(warm.finished.values()) == {"length"}


def test_write_through_bound_follows_its_variable(tiny_model_dir, monkeypatch):
    """LIGHTSPEED_WRITE_THROUGH_MIB sets the pages in flight to host (runner/factory.py), which the scheduler
    bounds its write-through by."""
    import dataclasses

    from lightspeed import envs
    from lightspeed.runner import factory

    for mib in (1, 2):
        monkeypatch.setattr(factory, "ENVS", dataclasses.replace(envs.ENVS, write_through_mib=mib))
        engine = make_engine(tiny_model_dir, max_num_seqs=2)
        page_bytes = engine.runner.kv_cache.layout.bytes_per_page
        assert engine.built.max_write_through_pages == max(1, (mib << 20) // page_bytes)
        assert engine.scheduler.config.max_write_through_pages == engine.built.max_write_through_pages
