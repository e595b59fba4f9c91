"""Fault injection for the gateway's fault suite (tests only; on PYTHONPATH of that suite's server).

With LIGHTSPEED_TEST_POISON_SEED=N, every Python process of the server (the gateway and its engine
core) loads this at start-up, and in the engine core a request whose seed is N fails while its
sampling state is bound, the way a per-request table allocation can fail on a device. With
LIGHTSPEED_TEST_HOLD_CORE_START=PATH, an engine core process waits at start-up while PATH exists, so
a test holds a restarting core down as long as it needs. Nothing else changes, so the rest of the
server is the real one.
"""

import os
import sys
import time

_SEED = os.environ.get("LIGHTSPEED_TEST_POISON_SEED")

if _SEED:
    from lightspeed.runner import sampling_state

    _bind = sampling_state.SamplingState.bind

    def _poisoned_bind(self, slot, req_id, spec, prompt_ids, output_ids):
        if spec.seed == int(_SEED):
            raise RuntimeError("injected fault in this request's sampling state")
        return _bind(self, slot, req_id, spec, prompt_ids, output_ids)

    sampling_state.SamplingState.bind = _poisoned_bind

_HOLD = os.environ.get("LIGHTSPEED_TEST_HOLD_CORE_START")

if _HOLD and "lightspeed.core.engine_core" in sys.orig_argv:
    while os.path.exists(_HOLD):
        time.sleep(0.05)
