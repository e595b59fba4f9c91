from types import SimpleNamespace

import pytest
import torch
from lightspeed_mla import (
    MLACache,
    decode_workspace_bytes,
    mla_decode,
    mla_decode_reference,
    plan_decode,
    run_decode,
    should_fold,
)
from lightspeed_mla.tuning import DecodeTile
from mla_helpers import make_paged_cache, query_start, rel_err

SCALE = 576 ** -0.5


def _check(kind, page_size, lens, q_lens, heads, tile=None, **overrides):
    g = torch.Generator().manual_seed(len(lens) * 1000 + sum(lens) + heads)
    cache, page_table = make_paged_cache(kind, page_size, lens, generator=g)
    qsl = query_start(q_lens)
    q = torch.randn(int(qsl[-1]), heads, 576, generator=g).to(torch.bfloat16)
    out, lse = mla_decode(q, cache, page_table, torch.tensor(lens), qsl, SCALE, return_lse=True,
                          tile=tile, **overrides)
    ref, ref_lse = mla_decode_reference(q, cache, page_table, torch.tensor(lens), qsl, SCALE)
    assert rel_err(out, ref) < 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_decode_page_sizes_and_boundaries(kind, page_size, swap_ab):
    # Lengths on, just past and just before page boundaries, and 1.
    lens = [1, page_size, page_size + 1, 2 * page_size - 1]
    _check(kind, page_size, lens, [1] * len(lens), 8, tile=DecodeTile(16, 16, 4, 1, swap_ab))


@pytest.mark.parametrize("q_len", [2, 3, 4, 16])
@pytest.mark.parametrize("fold", [True, False])
def test_decode_spec_tokens_causal(q_len, fold):
    lens = [q_len, q_len + 37]
    _check("bf16", 16, lens, [q_len] * 2, 8, fold=fold)


@pytest.mark.parametrize("num_splits", [2, 5])
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_decode_split_kv_combine(num_splits, kind):
    # Splits shorter than a request's tail and splits left empty by a short request.
    _check(kind, 16, [90, 7], [2, 2], 16, num_splits=num_splits)


@pytest.mark.parametrize("variant", ["serial", "blocked", "auto"])
@pytest.mark.parametrize("num_splits", [3, 21])
def test_combine_variants(monkeypatch, variant, num_splits):
    # 21 splits: more than one BLOCK_S block of the blocked combine, the last block partial; splits left
    # empty by the short request (its lse -inf) must weigh nothing.
    from lightspeed_mla import decode

    monkeypatch.setattr(decode, "COMBINE_VARIANT", variant)
    _check("bf16", 16, [700, 7], [1, 1], 8, num_splits=num_splits)


def test_auto_combine_is_blocked_from_64_splits(monkeypatch):
    from lightspeed_mla import decode
    from lightspeed_mla.kernels import decode_triton

    launched = []

    class Recorder:  # stands in for a Triton kernel: `kernel[grid](...)` records the kernel's name
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(self.name)

    for name in ("_combine_kernel", "_combine_blocked_kernel"):
        monkeypatch.setattr(decode_triton, name, Recorder(name))
    monkeypatch.setattr(decode, "COMBINE_VARIANT", "auto")
    for splits in (decode.BLOCKED_COMBINE_MIN_SPLITS - 1, decode.BLOCKED_COMBINE_MIN_SPLITS):
        plan = SimpleNamespace(num_tokens=1, num_heads=8, num_splits=splits,
                               partial_out=torch.zeros(1, 8, splits, 512), partial_lse=torch.zeros(1, 8, splits))
        decode.combine_splits(plan, torch.zeros(1, 8, 512), None)
    assert launched == ["_combine_kernel", "_combine_blocked_kernel"]


def test_unknown_combine_variant_is_a_clear_error(monkeypatch):
    from lightspeed_mla import decode

    monkeypatch.setattr(decode, "COMBINE_VARIANT", "fast")
    with pytest.raises(ValueError, match="LIGHTSPEED_MLA_COMBINE"):
        _check("bf16", 16, [90], [1], 8, num_splits=2)


def test_decode_ragged_queries_absorbed_prefill():
    # Different query counts per request, one request with none: absorbed prefill of short extends.
    _check("bf16", 16, [40, 5, 33, 20], [7, 0, 1, 20], 8, num_splits=3)


def test_decode_many_heads_several_row_tiles():
    _check("fp8", 32, [50], [2], 40, fold=True, tile=DecodeTile(16, 16, 4, 1, True))


def test_should_fold_rule():
    assert should_fold(16, 4, 64) and should_fold(8, 16, 64) and should_fold(32, 2, 64)
    assert not should_fold(16, 1, 64)  # one query token: nothing to fold
    assert not should_fold(64, 4, 64) and not should_fold(128, 2, 64)  # heads fill the tile alone


def test_plan_run_reuses_workspace_without_allocating():
    torch.manual_seed(1)
    H, q_len, lens = 8, 2, [30, 61]
    cache, page_table = make_paged_cache("bf16", 16, lens)
    qsl = query_start([q_len] * 2)
    ws = torch.empty(decode_workspace_bytes(2, 4, H, 4), dtype=torch.uint8)
    plan = plan_decode(ws, qsl, lens, H, page_size=16, softmax_scale=SCALE, num_splits=4)
    assert plan.num_splits == 4 and plan.partial_out.data_ptr() >= ws.data_ptr()
    out = torch.full((4, H, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((4, H), float("nan"))
    for _layer in range(2):  # per layer: new q, same plan, same buffers
        q = torch.randn(4, H, 576).to(torch.bfloat16)
        assert run_decode(plan, q, cache, page_table, out, lse) is out
        ref, ref_lse = mla_decode_reference(q, cache, page_table, torch.tensor(lens), qsl, SCALE)
        assert rel_err(out, ref) < 1e-2
        torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-3)
    # Re-planning the next step with the same shape keeps every device address (graph replay).
    plan2 = plan_decode(ws, qsl, [31, 62], H, page_size=16, softmax_scale=SCALE, num_splits=4)
    assert plan2.seq_lens.data_ptr() == plan.seq_lens.data_ptr()
    assert plan2.partial_out.data_ptr() == plan.partial_out.data_ptr()
    assert plan2.seq_lens.tolist() == [31, 62]


def test_plan_validates_inputs():
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    with pytest.raises(ValueError):
        plan_decode(ws, [0, 3], [2], 8, page_size=16, softmax_scale=1.0)  # more queries than keys
    with pytest.raises(ValueError):
        plan_decode(ws, [0, 1], [5], 8, page_size=24, softmax_scale=1.0)
    with pytest.raises(ValueError):
        plan_decode(torch.empty(64, dtype=torch.uint8), [0, 1], [4096], 8, page_size=16, softmax_scale=1.0,
                    num_splits=8)
    plan = plan_decode(ws, [0, 1], [5], 8, page_size=16, softmax_scale=1.0)
    cache = MLACache.empty(1, 16, "bf16")
    with pytest.raises(ValueError):
        run_decode(plan, torch.zeros(1, 8, 512, dtype=torch.bfloat16), cache, torch.zeros(1, 1, dtype=torch.int32),
                   torch.empty(1, 8, 512, dtype=torch.bfloat16))
    with pytest.raises(ValueError):  # cache kind differs from the plan's
        run_decode(plan, torch.zeros(1, 8, 576, dtype=torch.bfloat16), MLACache.empty(1, 16, "fp8"),
                   torch.zeros(1, 1, dtype=torch.int32), torch.empty(1, 8, 512, dtype=torch.bfloat16))


def test_empty_batch():
    cache = MLACache.empty(1, 16, "bf16")
    out = mla_decode(torch.zeros(0, 8, 576, dtype=torch.bfloat16), cache, torch.zeros(0, 1, dtype=torch.int32),
                     torch.zeros(0, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), SCALE)
    assert out.shape == (0, 8, 512)


def test_split_count_fills_one_wave_without_a_tail():
    from lightspeed_mla.decode import choose_num_splits

    assert choose_num_splits(16, 16384, 132, 128, ctas_per_sm=2) == 16  # 256 CTAs <= 264 slots
    assert choose_num_splits(128, 81920, 132, 128, ctas_per_sm=2) == 2
    assert choose_num_splits(4, 81920, 132, 128, ctas_per_sm=1) == 33
    assert choose_num_splits(4, 1000, 132, 128, ctas_per_sm=1) == 3  # splits stay >= 256 keys
    assert choose_num_splits(300, 81920, 132, 128, ctas_per_sm=2) == 1
    assert choose_num_splits(1, 81920, 132, 128, ctas_per_sm=2) == 128
