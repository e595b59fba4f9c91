"""The inner step shared by the paged prefill and decode kernels: one BLOCK_N tile of keys.

Online softmax in base 2 (FlashAttention-2): scores are scaled by softmax_scale * log2(e) once, the
running max `m_i` starts at a large finite negative so that a row whose keys are all masked in a
tile (causal edge, split past its end) keeps p = 0 instead of NaN.
"""

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
NEG_BIG = -1.0e30


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _load_rows(ptrs, mask, USE_MASK: tl.constexpr):
    if USE_MASK:
        return tl.load(ptrs, mask=mask, other=0.0)
    return tl.load(ptrs)


@triton.jit
def attend_tile(
    acc,
    m_i,
    l_i,
    q,
    k_cache,
    v_cache,
    pt_row_ptr,
    n0,
    kv_end,
    row_limit,
    head_off,
    stride_cp,
    stride_co,
    qk_scale,
    soft_cap,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_SOFT_CAP: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    MASKED: tl.constexpr = True,
):
    """acc: [M, BLOCK_D] fp32, m_i/l_i: [M] fp32, q: [M, BLOCK_D] (compute dtype);
    keys n0 .. n0+BLOCK_N of the request whose page-table row starts at pt_row_ptr; key j is visible
    to row r iff j < kv_end and j <= row_limit[r]. qk_scale includes log2(e) (and the fp8 k scale).
    MASKED=False: the caller knows every key of the tile is visible to every row (the tiles left of
    a prefill block's causal diagonal), so no per-element mask is built or applied."""
    tok = n0 + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    if MASKED:
        in_range = tok < kv_end
        page = tl.load(pt_row_ptr + tok // PAGE_SIZE, mask=in_range, other=0).to(tl.int64)
        kv_mask = in_range[:, None] & (dims < HEAD_DIM)[None, :]
    else:
        page = tl.load(pt_row_ptr + tok // PAGE_SIZE).to(tl.int64)
        kv_mask = (dims < HEAD_DIM)[None, :]
    # kv offsets: [BLOCK_N] -> rows of the cache for this kv head
    row_off = page * stride_cp + (tok % PAGE_SIZE).to(tl.int64) * stride_co + head_off
    k = _load_rows(k_cache + row_off[:, None] + dims[None, :], kv_mask, MASKED or BLOCK_D != HEAD_DIM)
    if DOT_UPCAST:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    if HAS_SOFT_CAP:
        # qk_scale = scale * log2e * k_scale; soft cap applies to the natural-unit logit
        s = s * (qk_scale / 1.4426950408889634)
        s = soft_cap * _tanh(s / soft_cap) * 1.4426950408889634
        if MASKED:
            visible = (tok[None, :] <= row_limit[:, None]) & in_range[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
    elif MASKED:
        visible = (tok[None, :] <= row_limit[:, None]) & in_range[None, :]
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
    else:
        # qk_scale > 0, so max(s) * scale = max(s * scale): the scale folds into one FMA per score
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = _load_rows(v_cache + row_off[:, None] + dims[None, :], kv_mask, MASKED or BLOCK_D != HEAD_DIM)
    acc = acc * alpha[:, None]
    # the MMA accumulates into acc in place (no separate add of a fresh product tile)
    if DOT_UPCAST:
        acc = tl.dot(p, v.to(tl.float32), acc)
    else:
        acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc)
    return acc, m_new, l_i
