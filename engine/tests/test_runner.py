"""ModelRunner + Scheduler in-process on a tiny random Llama: batching, chunking, overlap, sampling state."""

import numpy as np
import pytest
import torch
from lightspeed.config import EngineConfig
from lightspeed.core.messages import SamplingSpec
from lightspeed.runner.factory import build_model_runner


def _engine(tiny_model_dir, **overrides):
    from lightspeed_scheduler import Scheduler, SchedulerConfig

    torch.set_num_threads(1)
    settings = {"kv_cache_memory": "8MiB", "host_cache_memory": "1MiB", "max_num_seqs": 8, "max_model_len": 256,
                **overrides}
    cfg = EngineConfig(model=tiny_model_dir, load_format="dummy", **settings)
    built = build_model_runner(cfg)
    sched = Scheduler(SchedulerConfig(
        page_size=cfg.page_size, num_device_pages=built.num_device_pages, num_host_pages=built.num_host_pages,
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
        chunked_prefill_size=cfg.chunked_prefill_size, max_model_len=built.max_model_len,
        enable_prefix_cache=cfg.enable_prefix_cache))
    built.runner._output_tokens_of = sched.output_token_ids
    return built.runner, sched


def _submit(runner, sched, prompts, spec):
    from lightspeed_scheduler import RequestSpec

    ids = []
    for i, prompt in enumerate(prompts):
        rid = sched.submit(RequestSpec(rid=f"r{i}", token_ids=prompt, max_new_tokens=spec.max_tokens,
                                       ignore_eos=True))
        runner.add_request(rid, spec, prompt)
        ids.append(rid)
    return ids


def _collect(outputs, result):
    for rid, tok in zip(result.req_ids.tolist(), result.tokens.tolist(), strict=True):
        outputs.setdefault(rid, []).append(tok)


def _run_sync(runner, sched):
    outputs = {}
    while sched.has_unfinished():
        plan = sched.next_plan()
        result = runner.execute(plan)
        _collect(outputs, result)
        sched.advance(plan, result.tokens)
    return outputs


def _run_overlapped(runner, sched):
    """Plan N+1 is built (and executed) before plan N is advanced: its decode inputs are deferred."""
    outputs, saw_deferred = {}, False
    plan = sched.next_plan()
    result = runner.execute(plan)
    while True:
        nxt = sched.next_plan() if sched.has_unfinished() else None
        finished = {r for r, _ in sched.advance(plan, result.tokens)}
        _collect(outputs, result)
        if nxt is None:
            return outputs, saw_deferred
        saw_deferred |= bool(nxt.deferred_input_mask.any())
        result = runner.execute(nxt)
        # Rows of requests that finished in step N are void in step N+1.
        keep = ~np.isin(result.req_ids, list(finished))
        result.req_ids, result.tokens = result.req_ids[keep], result.tokens[keep]
        plan = nxt
        if not sched.has_unfinished() and plan.num_reqs == 0:
            return outputs, saw_deferred


PROMPTS = [list(range(3, 40)), list(range(100, 105)), list(range(7, 90))]
GREEDY = SamplingSpec(max_tokens=10, temperature=0.0, ignore_eos=True)


def test_batched_chunked_equals_alone(tiny_model_dir):
    runner, sched = _engine(tiny_model_dir, chunked_prefill_size=16, max_num_batched_tokens=32)
    ids = _submit(runner, sched, PROMPTS, GREEDY)
    batched = _run_sync(runner, sched)
    for rid, prompt in zip(ids, PROMPTS, strict=True):
        alone_runner, alone_sched = _engine(tiny_model_dir)
        (alone_id,) = _submit(alone_runner, alone_sched, [prompt], GREEDY)
        assert _run_sync(alone_runner, alone_sched)[alone_id] == batched[rid]
        assert len(batched[rid]) == 10


def test_overlapped_loop_matches_sync(tiny_model_dir):
    runner, sched = _engine(tiny_model_dir)
    ids = _submit(runner, sched, PROMPTS, GREEDY)
    sync = _run_sync(runner, sched)
    runner2, sched2 = _engine(tiny_model_dir)
    ids2 = _submit(runner2, sched2, PROMPTS, GREEDY)
    overlapped, saw_deferred = _run_overlapped(runner2, sched2)
    assert saw_deferred, "the overlapped loop never exercised deferred inputs"
    for a, b in zip(ids, ids2, strict=True):
        assert overlapped[b][:10] == sync[a]


def test_sampling_state_rows_and_penalties(tiny_model_dir):
    runner, sched = _engine(tiny_model_dir)
    spec = SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True, frequency_penalty=2.0, presence_penalty=2.0)
    (rid,) = _submit(runner, sched, [PROMPTS[0]], spec)
    out = _run_sync(runner, sched)[rid]
    state = runner.sampling
    slot = int(np.nonzero(runner._slot_owner == rid)[0][0])
    counts = state.output_counts[slot]
    assert int(counts.sum()) == 6
    for tok in set(out):
        assert int(counts[tok]) == out.count(tok)
    assert bool(state.prompt_mask[slot, PROMPTS[0]].all()) and int(state.offsets[slot]) == 6
    assert len(set(out)) == len(out)  # strong penalties forbid repeats


def test_logprobs_rows(tiny_model_dir):
    runner, sched = _engine(tiny_model_dir)
    a, b = _submit(runner, sched, PROMPTS[:2], GREEDY)
    runner.remove_request(b)
    runner.add_request(b, SamplingSpec(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2), PROMPTS[1])
    plan = sched.next_plan()
    result = runner.execute(plan)
    rows = result.logprob_rows.tolist()
    assert [int(result.req_ids[r]) for r in rows] == [b]
    assert result.top_ids.shape == (1, 2) and int(result.ranks[0]) == 1
    assert int(result.top_ids[0, 0]) == int(result.tokens[rows[0]])
    assert result.token_logprobs[0] == pytest.approx(result.top_logprobs[0, 0])
    sched.advance(plan, result.tokens)


def test_host_tier_write_back_and_load_back_keep_outputs(tiny_model_dir):
    """A tiny device pool forces the prefix cache to spill to the host pool; a later hit loads the
    pages back (plan.load_back) and must reproduce the same tokens as the first run."""
    runner, sched = _engine(tiny_model_dir, kv_cache_memory=48 * 4096, host_cache_memory=256 * 4096,
                            max_num_seqs=2, max_model_len=256)
    copies = {"write_back": 0, "load_back": 0}
    original = runner.execute

    def counting(plan):
        copies["write_back"] += plan.write_back.shape[0]
        copies["load_back"] += plan.load_back.shape[0]
        return original(plan)

    runner.execute = counting
    first = list(range(10, 170))
    spec = SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = []
    for prompt in (first, list(range(300, 460)), list(range(600, 760)), first):
        (rid,) = _submit(runner, sched, [prompt], spec)
        outs.append(_run_sync(runner, sched)[rid])
    assert copies["write_back"] > 0, "the device pool never spilled to the host"
    assert copies["load_back"] > 0, "the repeated prompt was not served from the host tier"
    assert outs[3] == outs[0]
    sched.check_invariants()
