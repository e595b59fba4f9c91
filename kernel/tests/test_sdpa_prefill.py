"""sdpa_split_prefill: the split into rectangle + square and the log-sum-exp merge against the
reference (CPU: torch's CPU flash kernel), the paged op over batches with awkward rows, the
registration (below Triton, by override only), what it hands on, and the per-step host read."""

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel import Priority, ops, sdpa
from lightspeed_kernel.reference import attention as ref

from .paged_helpers import build_batch
from .test_contract import assert_honours_op_signature

HOPPER = lk.Platform.parse("sm_90")


def _batch(cached, q_lens, page_size=16, heads=(8, 2), head_dim=64, dtype=torch.bfloat16, seed=0):
    batch = build_batch(cached, q_lens, page_size, heads[1], head_dim, dtype, seed=seed)
    k_cache = torch.zeros(batch["cache_shape"], dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    for b, slots in enumerate(batch["seq_slots"]):
        ops.store_kv(batch["k_seq"][b], batch["v_seq"][b], k_cache, v_cache, slots)
    q = torch.randn(sum(q_lens), heads[0], head_dim, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    args = (q, k_cache, v_cache, batch["page_table"], batch["query_start_loc"], batch["seq_lens"])
    return args, dict(max_query_len=max(q_lens, default=1), scale=head_dim**-0.5)


def _close(got, want, dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert ((got.double() - want.double()).norm() / want.double().norm()).item() < tol


@pytest.mark.parametrize("prefix, length", [(0, 1), (0, 37), (1, 1), (50, 1), (33, 20), (200, 64)])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 1)])
def test_split_and_merge_equal_one_causal_attention(prefix, length, heads):
    g = torch.Generator().manual_seed(prefix * 100 + length)
    hq, hkv = heads
    q = torch.randn(length, hq, 32, generator=g)
    keys, values = (torch.randn(prefix + length, hkv, 32, generator=g) for _ in range(2))
    # one request as the reference sees it: dense pages of 1 token
    table = torch.arange(prefix + length, dtype=torch.int32)[None]
    want = ref.attention_prefill(q, keys[:, None], values[:, None], table, torch.tensor([0, length], dtype=torch.int32),
                                 torch.tensor([prefix + length], dtype=torch.int32), max_query_len=length,
                                 scale=32**-0.5)
    got = sdpa.attend_request(q, keys, values, prefix, 32**-0.5)
    _close(got, want, torch.float32)


class _Unusable:
    def __call__(self, *args, **kwargs):
        raise AssertionError("the split path ran for a call it must hand on")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_batches_equal_the_reference(dtype, page_size):
    # page boundaries, a zero-length row between others, a fresh prompt, one-token rows; called on a
    # fresh SplitPrefill, so a failure inside it cannot hide behind the hand-on to the reference
    cached, q_lens = [0, 15, 16, 70, 0, 129], [23, 1, 0, 45, 1, 17]
    args, kw = _batch(cached, q_lens, page_size=page_size, dtype=dtype)
    want = ref.attention_prefill(*args, **kw)
    split = sdpa.SplitPrefill()
    got = split(*args, scale=kw["scale"])
    assert got is not None and split.failed is None
    _close(got, want, dtype)
    out = torch.full_like(args[0], float("nan"))
    assert split(*args, scale=kw["scale"], out=out) is out
    _close(out, want, dtype)


def test_the_registered_op_runs_the_split_under_inference_mode_once_per_step(monkeypatch):
    # the engine builds each step's metadata under inference_mode: such tensors have no version counter
    split = sdpa.SplitPrefill()
    monkeypatch.setattr(sdpa, "SPLIT", split)
    scale = 0.2  # not 1/sqrt(D): a lost scale= shows
    for step in range(3):
        with torch.inference_mode():
            args, kw = _batch([40 + step, 0], [9, 12], seed=step)
            for _layer in range(4):
                got = sdpa.sdpa_split_prefill(*args, max_query_len=kw["max_query_len"], scale=scale)
        _close(got, ref.attention_prefill(*args, max_query_len=kw["max_query_len"], scale=scale), torch.bfloat16)
    assert split.failed is None and split.host_reads == 3


def test_registered_below_triton_and_reachable_by_override():
    spec = next(s for s in lk.list_kernels("attention", "prefill") if s.name == sdpa.KERNEL)
    assert spec.priority == Priority.PORTABLE and spec.solution == "torch_sdpa"
    assert_honours_op_signature(spec)
    assert lk.select_kernel("attention", "prefill", torch.bfloat16, platform=HOPPER).name != sdpa.KERNEL
    forced = lk.select_kernel("attention", "prefill", torch.bfloat16, platform=HOPPER, override=sdpa.KERNEL)
    assert forced.name == sdpa.KERNEL
    # not a candidate on CPU: its capability names NVIDIA
    assert lk.select_kernel("attention", "prefill", torch.bfloat16, platform=lk.CPU).name != sdpa.KERNEL


@pytest.mark.parametrize("extra", [dict(soft_cap=30.0), dict(k_scale=0.5, v_scale=0.5)])
def test_calls_it_does_not_take_go_to_the_next_kernel(extra, monkeypatch):
    args, kw = _batch([40, 0], [9, 12])
    monkeypatch.setattr(sdpa, "SPLIT", _Unusable())
    _close(sdpa.sdpa_split_prefill(*args, **kw, **extra), ref.attention_prefill(*args, **kw, **extra), torch.bfloat16)


def test_fp8_cache_goes_to_the_next_kernel(monkeypatch):
    args, kw = _batch([20], [5])
    q, k_cache, v_cache, *rest = args
    k8, v8 = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    assert sdpa.unsupported_reason(q, k8, v8, None, None, None, None).startswith("cache dtypes")
    monkeypatch.setattr(sdpa, "SPLIT", _Unusable())
    _close(sdpa.sdpa_split_prefill(q, k8, v8, *rest, **kw), ref.attention_prefill(q, k8, v8, *rest, **kw),
           torch.bfloat16)


def test_lengths_are_read_once_per_step_metadata():
    split = sdpa.SplitPrefill()
    args, kw = _batch([30, 3], [7, 16])
    for _ in range(4):  # the layers of one step: same metadata tensors
        split(*args, scale=kw["scale"])
    assert split.host_reads == 1
    args[5].add_(0)  # a new step's in-place rewrite bumps torch's version counter
    split(*args, scale=kw["scale"])
    assert split.host_reads == 2


def test_host_lengths_replace_the_read_back():
    # the engine passes its plan's lengths: same output, no read of the device tensors
    split = sdpa.SplitPrefill()
    args, kw = _batch([30, 0, 3], [7, 4, 16])
    host = ops.HostLengths(args[4].numpy().copy(), args[5].numpy().copy())
    want = ref.attention_prefill(*args, **kw)
    for _ in range(3):
        got = split(*args, scale=kw["scale"], host_lengths=host)
    _close(got, want, torch.bfloat16)
    assert split.host_reads == 0
    got = sdpa.sdpa_split_prefill(*args, **kw, host_lengths=host)  # the registered op forwards them
    _close(got, want, torch.bfloat16)


def test_a_backend_that_fails_its_probe_hands_every_call_on(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no such kernel")

    split = sdpa.SplitPrefill()
    monkeypatch.setattr(sdpa, "_attend", broken)
    args, kw = _batch([10], [4])
    assert split(*args, scale=kw["scale"]) is None
    assert "unavailable" in next(iter(split._probed.values()))
    monkeypatch.setattr(sdpa, "SPLIT", split)
    _close(sdpa.sdpa_split_prefill(*args, **kw), ref.attention_prefill(*args, **kw), torch.bfloat16)


def test_a_call_the_backend_refuses_hands_it_and_every_later_call_on(monkeypatch):
    def refuses(*a, **k):
        raise RuntimeError("no kernel for this shape")

    split = sdpa.SplitPrefill()
    monkeypatch.setattr(sdpa, "SPLIT", split)
    monkeypatch.setattr(sdpa, "attend_request", refuses)
    args, kw = _batch([30, 0], [6, 9])
    _close(sdpa.sdpa_split_prefill(*args, **kw), ref.attention_prefill(*args, **kw), torch.bfloat16)
    assert split.failed.startswith("flash backend failed: RuntimeError")
    monkeypatch.undo()
    assert split(*args, scale=kw["scale"]) is None  # stays handed on


def test_a_backend_whose_log_sum_exp_has_another_base_fails_its_probe(monkeypatch):
    real = sdpa._attend

    def log2_lse(*a, **k):
        out, lse = real(*a, **k)
        return out, lse * 1.4426950408889634

    split = sdpa.SplitPrefill()
    monkeypatch.setattr(sdpa, "_attend", log2_lse)
    args, kw = _batch([10], [4])
    assert split(*args, scale=kw["scale"]) is None
    assert "log-sum-exp" in next(iter(split._probed.values()))


def test_unknown_backend_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(sdpa.BACKEND_ENV, "fa9")
    with pytest.raises(ValueError, match="expected 'cudnn' or 'flash'"):
        sdpa.SplitPrefill()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cudnn", "flash"])
@pytest.mark.parametrize("cached, q_lens, page_size, heads, head_dim", [
    ([0, 1000, 4999, 17], [300, 64, 1, 129], 16, (32, 8), 128),
    ([20000], [800], 16, (32, 8), 128),
    ([0], [4096], 64, (16, 2), 64),
])
def test_backends_match_the_reference_on_gpu(backend, cached, q_lens, page_size, heads, head_dim):
    split = sdpa.SplitPrefill(backend)
    args, kw = _batch(cached, q_lens, page_size=page_size, heads=heads, head_dim=head_dim, seed=3)
    args = tuple(t.cuda() for t in args)
    got = split(*args, scale=kw["scale"])
    assert got is not None, f"{backend}: {next(iter(split._probed.values()))}"
    _close(got, ref.attention_prefill(*args, **kw), torch.bfloat16)
