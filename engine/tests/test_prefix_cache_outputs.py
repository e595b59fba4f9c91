"""A conversation's next turn sends its previous prompt and answer back: the answer's KV, computed
while decoding, must be a prefix-cache hit too (agentic turns would otherwise recompute every answer)."""

from __future__ import annotations

import pytest
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_next_turn_hits_the_pages_of_the_previous_answer(tiny_model_dir, async_scheduling):
    engine = make_engine(tiny_model_dir, async_scheduling=async_scheduling, page_size=16)
    prompt = [(7 * i + 3) % 200 + 5 for i in range(40)]
    spec = SamplingSpec(max_tokens=50, min_tokens=50, temperature=0.0, ignore_eos=True)
    submit(engine, "turn-1", prompt, spec)
    first = run_until_idle(engine)
    answer = first.tokens["turn-1"]
    assert len(answer) == 50
    history = prompt + answer  # 90 tokens; the last answer token's KV is never computed (it was sampled last)
    submit(engine, "turn-2", history + [11, 12, 13], SamplingSpec(max_tokens=1, temperature=0.0))
    second = run_until_idle(engine)
    # every full page of the 89 tokens whose KV exists: 5 pages of 16
    assert second.cached["turn-2"] == (len(history) - 1) // 16 * 16
