"""Fault isolation in the engine loop: a failure that belongs to one request (or one step) fails only
that; admission rejects what would not fit; grammars compile off the step loop."""

import math
import re
import time

import pytest
import torch
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core import messages as m
from lightspeed.kv import KVTransferError
from lightspeed.runner.sampling_state import table_bytes

GREEDY = m.SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = {"a": list(range(3, 40)), "b": list(range(100, 105)), "c": list(range(7, 60))}


def _baseline(model_dir, names=("a", "b", "c")):
    engine = make_engine(model_dir)
    for name in names:
        submit(engine, name, PROMPTS[name], GREEDY)
    return run_until_idle(engine).tokens


def _free_pages_back(engine) -> None:
    stats = engine.scheduler.stats()
    assert stats["free_device_pages"] + stats["cached_device_pages"] == engine.built.num_device_pages - 1
    engine.scheduler.check_invariants()


def test_failure_in_one_requests_sampling_state_fails_only_it(tiny_model_dir):
    baseline = _baseline(tiny_model_dir, ("a", "c"))
    engine = make_engine(tiny_model_dir)
    bind = engine.runner.sampling.bind

    def poisoned(slot, req_id, spec, prompt, outputs):
        if spec.seed == 666:
            raise RuntimeError("injected fault in this request's sampling state")
        bind(slot, req_id, spec, prompt, outputs)

    engine.runner.sampling.bind = poisoned
    submit(engine, "a", PROMPTS["a"], GREEDY)
    submit(engine, "b", PROMPTS["b"], m.SamplingSpec(max_tokens=8, temperature=0.0, seed=666, ignore_eos=True))
    submit(engine, "c", PROMPTS["c"], GREEDY)
    run = run_until_idle(engine)
    print(f"\nfault suite (in-process): 3 requests, 1 injected sampling-state fault -> "
          f"finished {run.finished}")
    assert run.finished == {"a": "length", "b": "error", "c": "length"}
    assert "internal error" in run.errors["b"] and "Traceback" not in run.errors["b"]
    assert run.tokens["a"] == baseline["a"] and run.tokens["c"] == baseline["c"]
    _free_pages_back(engine)
    # The engine goes on serving.
    submit(engine, "d", PROMPTS["a"], GREEDY)
    assert run_until_idle(engine).tokens["d"] == baseline["a"]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_failing_step_fails_its_requests_and_the_engine_carries_on(tiny_model_dir, overlap):
    engine = make_engine(tiny_model_dir, async_scheduling=overlap)
    forward, calls = engine.runner.forward, []

    def flaky(plan, tensors):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected fault in one step")
        return forward(plan, tensors)

    engine.runner.forward = flaky
    for name in ("a", "b"):
        submit(engine, name, PROMPTS[name], GREEDY)
    run = run_until_idle(engine)
    assert run.finished == {"a": "error", "b": "error"}
    assert all(len(run.tokens.get(n, [])) < 8 for n in ("a", "b"))
    assert engine._guard.num_failed_steps == 1
    _free_pages_back(engine)
    submit(engine, "c", PROMPTS["c"], GREEDY)
    later = run_until_idle(engine)
    assert later.finished == {"c": "length"} and later.tokens["c"] == _baseline(tiny_model_dir, ("c",))["c"]


def test_fatal_errors_and_repeated_step_failures_end_the_core(tiny_model_dir):
    engine = make_engine(tiny_model_dir)

    def device_lost(plan, tensors):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    engine.runner.forward = device_lost
    submit(engine, "a", PROMPTS["a"], GREEDY)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run_until_idle(engine)

    engine = make_engine(tiny_model_dir)

    def always(plan, tensors):
        raise ValueError("a bug that every step hits")

    engine.runner.forward = always
    for i in range(5):  # each step fails its requests; the third in a row is not one batch's problem
        submit(engine, f"r{i}", PROMPTS["a"], GREEDY)
        if i < 2:
            assert run_until_idle(engine).finished == {f"r{i}": "error"}
    with pytest.raises(ValueError, match="every step"):
        run_until_idle(engine)


def test_kv_copies_that_cannot_start_end_the_core_instead_of_stranding_their_requests(tiny_model_dir):
    # A request loading its prefix from host has no row in the plan that carries the copy: failing
    # "the plan's requests" would leave it waiting for an acknowledgement that never comes.
    engine = make_engine(tiny_model_dir, kv_cache_memory=48 * 4096, host_cache_memory=256 * 4096, max_num_seqs=2)
    first = list(range(10, 170))
    for i, prompt in enumerate((first, list(range(300, 460)), list(range(600, 760)))):
        submit(engine, f"p{i}", prompt, GREEDY)  # the third pushes the first off the device
        run_until_idle(engine)
    copier, submit_copies = engine.runner.kv_cache.copier, engine.runner.kv_cache.copier.submit

    def refuse_load_backs(step_id, write_back, load_back, forward_waits):
        if load_back.shape[0]:
            raise RuntimeError("injected: cudaMemcpy2DAsync failed")
        return submit_copies(step_id, write_back, load_back, forward_waits)

    copier.submit = refuse_load_backs
    submit(engine, "again", first, GREEDY)
    with pytest.raises(KVTransferError, match="could not be started"):
        run_until_idle(engine)


def test_admission_rejects_what_does_not_fit_naming_the_field(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_logit_bias=4, max_stop_token_ids=3, max_queued_requests=2,
                         max_num_seqs=2)
    cases = {
        "logit_bias": m.SamplingSpec(max_tokens=4, logit_bias={i: 1.0 for i in range(5)}),
        "stop_token_ids": m.SamplingSpec(max_tokens=4, stop_token_ids=[5, 6, 7, 8]),
        "eos_token_ids": m.SamplingSpec(max_tokens=4, eos_token_ids=list(range(20))),
        "finite": m.SamplingSpec(max_tokens=4, temperature=math.nan),
        "top_p": m.SamplingSpec(max_tokens=4, top_p=0.0),
        "max_tokens": m.SamplingSpec(max_tokens=0),
        "structured": m.SamplingSpec(max_tokens=4, structured_kind="yaml", structured_spec="x"),
    }
    for field, spec in cases.items():
        error = engine.add_request(m.AddRequest(field, [1, 2, 3], spec))
        assert error is not None and field.split("_")[0] in error, (field, error)
    assert "priority" in engine.add_request(m.AddRequest("p", [1, 2, 3], GREEDY, priority=2**31))
    assert "priority" in engine.add_request(m.AddRequest("p", [1, 2, 3], GREEDY, priority=-(2**31)))
    # The queue: max_num_seqs + max_queued_requests unfinished requests at most.
    for i in range(4):
        submit(engine, f"q{i}", PROMPTS["a"], GREEDY)
    assert "queue is full" in engine.add_request(m.AddRequest("q4", PROMPTS["a"], GREEDY))
    run = run_until_idle(engine)
    assert set(run.finished) == {f"q{i}" for i in range(4)} and not run.errors


def test_sampling_tables_are_presized_inside_the_budget(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_logit_bias=32, max_stop_token_ids=8)
    s, seqs, vocab = engine.runner.sampling, engine.config.num_request_slots, engine.vocab_size
    tables = [s.output_counts, s.prompt_mask, s.bias_ids, s.bias_vals, s.stop_ids]
    assert [tuple(t.shape) for t in tables] == [(seqs, vocab), (seqs, vocab), (seqs, 32), (seqs, 32), (seqs, 24)]
    allocated = sum(t.numel() * t.element_size() for t in tables)
    assert allocated <= table_bytes(seqs, vocab, 32, 24)
    # A request with every optional table in use allocates nothing new.
    before = [t.data_ptr() for t in tables]
    spec = m.SamplingSpec(max_tokens=4, temperature=0.7, seed=1, presence_penalty=0.5, min_tokens=2,
                          logit_bias={i: 0.5 for i in range(32)}, stop_token_ids=list(range(8)), eos_token_ids=[2])
    submit(engine, "x", PROMPTS["a"], spec)
    assert run_until_idle(engine).finished == {"x": "length"}
    assert [t.data_ptr() for t in (s.output_counts, s.prompt_mask, s.bias_ids, s.bias_vals, s.stop_ids)] == before


def test_grammar_compiles_off_the_step_loop(tiny_model_dir, default_model_path):
    engine = make_engine(tiny_model_dir, tokenizer=default_model_path, grammar_cache_size=2)
    compiler = engine.runner.structured.compiler
    gate = []
    original = compiler._compile

    def slow_compile(kind, spec):
        while not gate:  # the worker holds the grammar until the test lets it go
            time.sleep(0.01)
        return original(kind, spec)

    compiler._compile = slow_compile
    started = time.monotonic()
    regex = m.SamplingSpec(max_tokens=6, temperature=0.0, structured_kind="regex", structured_spec="[0-9]{3}")
    assert engine.add_request(m.AddRequest("g", PROMPTS["b"], regex)) is None
    assert time.monotonic() - started < 0.5 and engine.has_pending_grammars()
    submit(engine, "plain", PROMPTS["a"], GREEDY)
    for _ in range(4):  # the unconstrained request decodes while the grammar compiles
        engine.admit_compiled()
        engine.step()
    assert engine.has_pending_grammars() and "g" not in engine._ids
    gate.append(True)
    bad = m.SamplingSpec(max_tokens=4, structured_kind="regex", structured_spec="(unclosed")
    assert engine.add_request(m.AddRequest("bad", PROMPTS["b"], bad)) is None
    run = run_until_idle(engine)
    from lightspeed import load_tokenizer

    assert re.fullmatch("[0-9]{3}", load_tokenizer(default_model_path).decode(run.tokens["g"][:3]))
    assert "invalid regex" in run.rejected["bad"] and "bad" not in run.finished
    for i in range(3):  # the LRU holds at most grammar_cache_size compiled grammars
        spec = m.SamplingSpec(max_tokens=2, structured_kind="regex", structured_spec=f"[a-c]{{{i + 1}}}")
        assert engine.add_request(m.AddRequest(f"lru{i}", PROMPTS["b"], spec)) is None
    run_until_idle(engine)
    assert compiler.num_cached <= 2


def test_a_failing_grammar_matcher_fails_only_its_request(tiny_model_dir, default_model_path):
    engine = make_engine(tiny_model_dir, tokenizer=default_model_path)
    regex = m.SamplingSpec(max_tokens=6, temperature=0.0, structured_kind="regex", structured_spec="[0-9]+")
    assert engine.add_request(m.AddRequest("g", PROMPTS["b"], regex)) is None
    submit(engine, "plain", PROMPTS["a"], GREEDY)
    while engine.has_pending_grammars():
        engine.admit_compiled()
        time.sleep(0.01)
    matcher = engine.runner.structured.matchers[engine._ids["g"]]

    class Broken:
        def __getattr__(self, name):
            if name == "fill_next_token_bitmask":
                raise RuntimeError("injected matcher fault")
            return getattr(matcher, name)

    engine.runner.structured.matchers[engine._ids["g"]] = Broken()
    run = run_until_idle(engine)
    assert run.finished == {"g": "error", "plain": "length"} and len(run.tokens["plain"]) == 8
    assert not engine.runner.structured.matchers
    _free_pages_back(engine)


def test_fp8_reference_store_saturates_like_the_kernel():
    from lightspeed_kernel.reference.kv_store import store_kv

    k = torch.tensor([[[500.0, -1000.0, 100.0, 448.0]]])
    cache = torch.zeros((1, 4, 1, 4), dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros_like(cache)
    store_kv(k, k, cache, v_cache, torch.tensor([0]), k_scale=1.0, v_scale=1.0)
    stored = cache[0, 0, 0].float()
    assert not torch.isnan(stored).any()
    expected = torch.tensor([448.0, -448.0, 100.0, 448.0]).to(torch.float8_e4m3fn).float()
    assert torch.equal(stored, expected)
