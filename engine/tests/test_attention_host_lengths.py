"""Attention layers hand the kernels the step's lengths on the host (`host_lengths`), equal to the
device tensors they slice, so a kernel that plans on the host (FlashInfer, the torch-SDPA split
prefill) never copies them back: under the overlapped loop that copy waits for the step in flight."""

from __future__ import annotations

import numpy as np
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec
from lightspeed.layers import attention as attention_layer


class LengthsSpy:
    """The attention ops as the layer calls them, checking each call's host lengths; every other op
    (KV stores, fused RoPE, ...) is the real one, so a new op the layer calls needs no change here."""

    def __init__(self, ops):
        self.ops, self.calls = ops, []
        self.attention_prefill, self.attention_decode = self._wrap("prefill"), self._wrap("decode")

    def __getattr__(self, name):  # only for names not set above
        return getattr(self.ops, name)

    def _wrap(self, mode):
        op = getattr(self.ops, f"attention_{mode}")

        def call(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, **kw):
            host = kw.get("host_lengths")
            if host is not None:
                assert np.array_equal(np.asarray(host.query_start_loc), query_start_loc.numpy()), mode
                assert np.array_equal(np.asarray(host.seq_lens), seq_lens.numpy()), mode
            self.calls.append((mode, host is not None, seq_lens.shape[0]))
            return op(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, **kw)

        return call


def test_prefill_and_decode_rows_of_mixed_steps_get_host_lengths(tiny_model_dir, monkeypatch):
    spy = LengthsSpy(attention_layer.ops)
    monkeypatch.setattr(attention_layer, "ops", spy)
    engine = make_engine(tiny_model_dir, async_scheduling=True, max_num_batched_tokens=32)
    spec = SamplingSpec(max_tokens=12, temperature=0.0)
    submit(engine, "first", [1, 2, 3, 4], spec)
    for _ in range(3):
        engine.step()  # "first" is decoding when the long prompts arrive
    submit(engine, "long", list(range(5, 85)), spec)  # chunked beside the decode: mixed steps
    submit(engine, "cached-prefix", [1, 2, 3, 4, 9, 9], spec)
    run = run_until_idle(engine)
    assert set(run.finished) == {"first", "long", "cached-prefix"}, run.errors
    prefills = [c for c in spy.calls if c[0] == "prefill"]
    assert prefills and all(given for _, given, _ in prefills)
    mixed_decodes = [c for c in spy.calls if c[0] == "decode" and c[1]]
    assert mixed_decodes, "no decode rows with host lengths: the test saw no mixed step"
