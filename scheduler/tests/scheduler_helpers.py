"""Helpers for the scheduler's Python tests. A module of its own, not conftest.py: pytest imports every test
folder's conftest under the one name `conftest`, so `from conftest import ...` picks up whichever folder's came
first when several packages' tests run in one invocation."""

import numpy as np
from lightspeed_scheduler import RequestSpec, Scheduler, SchedulerConfig


def make_scheduler(**overrides) -> Scheduler:
    config = dict(
        page_size=16,
        num_device_pages=1024,
        num_host_pages=4096,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        chunked_prefill_size=2048,
        max_model_len=32768,
        policy="decode_first",
        enable_prefix_cache=True,
    )
    config.update(overrides)
    return Scheduler(SchedulerConfig(**config))


def spec(rid: str, tokens, **overrides) -> RequestSpec:
    fields = dict(
        rid=rid,
        token_ids=list(tokens),
        max_new_tokens=16,
        eos_token_ids=[2],
        stop_token_ids=[],
        ignore_eos=False,
        priority=0,
        num_draft_tokens=0,
    )
    fields.update(overrides)
    return RequestSpec(**fields)


def samples(plan, token: int = 7) -> np.ndarray:
    return np.full(plan.num_samples, token, dtype=np.int32)
