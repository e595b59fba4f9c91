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
            [lp] = out.logprobs["asks"]  # one entry per token of the step (one without drafts)
            token = out.token_ids[out.request_ids.index("asks")]
            assert lp.rank == 1 and lp.top_ids[0] == token and len(lp.top_ids) == 2
            assert abs(lp.logprob - lp.top_logprobs[0]) < 1e-6
            seen.append(token)
    assert len(seen) == 4


def test_plain_greedy_only_when_nothing_edits_the_logits():
    """Rows whose token may be the decode graph's argmax of the raw logits: greedy, and no penalty,
    logit bias or min_tokens mask in the batch."""
    import torch
    from lightspeed.runner.sampling_state import SamplingState

    state = SamplingState(6, 10, torch.device("cpu"))
    state.bind(0, 1, SamplingSpec(max_tokens=8, temperature=0.0), [5], [])
    state.bind(1, 2, SamplingSpec(max_tokens=8, temperature=0.0), [5], [])
    state.bind(2, 3, SamplingSpec(max_tokens=8, temperature=0.8), [5], [])
    state.bind(3, 4, SamplingSpec(max_tokens=8, temperature=0.0, presence_penalty=0.5), [5], [])
    state.bind(4, 5, SamplingSpec(max_tokens=8, temperature=0.0, logit_bias={3: 1.0}), [5], [])
    state.bind(5, 6, SamplingSpec(max_tokens=8, temperature=0.0, min_tokens=2, eos_token_ids=[2]), [5], [])
    assert state.plain_greedy(np.array([0, 1]))
    for other in (2, 3, 4, 5):
        assert not state.plain_greedy(np.array([0, other])), other
    # min_tokens with nothing to ban (ignore_eos, no stop ids: a benchmark's fixed lengths) masks nothing
    state.bind(5, 7, SamplingSpec(max_tokens=8, temperature=0.0, min_tokens=8, ignore_eos=True, eos_token_ids=[2]),
               [5], [])
    assert state.plain_greedy(np.array([0, 5]))
    logits = torch.randn(2, 10)
    slots = np.array([0, 5])
    assert torch.equal(state.process_logits(logits.clone(), torch.from_numpy(slots), slots), logits)


def test_min_tokens_mask_bans_exactly_the_stop_ids():
    """Rows under min_tokens lose their stop/EOS ids (token 0 and padded rows included), others keep all."""
    import torch
    from lightspeed.runner.sampling_state import SamplingState

    state = SamplingState(4, 10, torch.device("cpu"))
    state.bind(0, 1, SamplingSpec(max_tokens=8, min_tokens=3, stop_token_ids=[0, 7], eos_token_ids=[2]), [5], [])
    state.bind(1, 2, SamplingSpec(max_tokens=8, min_tokens=3, eos_token_ids=[4]), [5], [])
    state.bind(2, 3, SamplingSpec(max_tokens=8), [5], [])
    logits = torch.randn(3, 10)
    expected = logits.clone()
    expected[0, [0, 2, 7]] = float("-inf")
    expected[1, 4] = float("-inf")
    slots = np.array([0, 1, 2])
    out = state.process_logits(logits, torch.from_numpy(slots), slots)
    assert torch.equal(out, expected)
