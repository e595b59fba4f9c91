"""ModelRunner state through the engine's loop: per-request sampling rows, penalties, logprobs."""

import numpy as np
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec

PROMPT = list(range(3, 40))


def test_sampling_state_rows_and_penalties(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    spec = SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True, frequency_penalty=2.0, presence_penalty=2.0)
    submit(engine, "a", PROMPT, spec)
    out = run_until_idle(engine).tokens["a"]
    runner, state = engine.runner, engine.runner.sampling
    slot = int(np.nonzero(runner._slot_owner >= 0)[0][0])
    counts = state.output_counts[slot]
    assert int(counts.sum()) == 6
    for tok in set(out):
        assert int(counts[tok]) == out.count(tok)
    assert bool(state.prompt_mask[slot, PROMPT].all()) and int(state.offsets[slot]) == 6
    assert len(set(out)) == len(out)  # strong penalties forbid repeats


def test_logprobs_rows(tiny_model_dir):
    """Only the request that asked gets logprobs; the top entry is the greedy token, rank 1."""
    engine = make_engine(tiny_model_dir)
    submit(engine, "plain", PROMPT, SamplingSpec(max_tokens=4, temperature=0.0, ignore_eos=True))
    submit(engine, "asks", list(range(100, 105)), SamplingSpec(max_tokens=4, temperature=0.0, ignore_eos=True,
                                                                logprobs=2))
    seen = []
    while engine.has_work():
        out = engine.step()
        if out.logprobs:
            assert set(out.logprobs) == {"asks"}
            lp = out.logprobs["asks"]
            token = out.token_ids[out.request_ids.index("asks")]
            assert lp.rank == 1 and lp.top_ids[0] == token and len(lp.top_ids) == 2
            assert abs(lp.logprob - lp.top_logprobs[0]) < 1e-6
            seen.append(token)
    assert len(seen) == 4
