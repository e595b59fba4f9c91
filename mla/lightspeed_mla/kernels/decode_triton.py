"""Absorbed MLA attention over a paged latent cache: split-KV Triton kernel and its combine step.

Design note (fold_sq). The latent cache has one shared head, so every query head of a request
reads the same 576-wide keys. The kernel therefore treats a request's (query token, head) pairs
as the rows of the MMA's M tile: row r is query token ``r // H_PAD`` and head ``r % H_PAD``.
* Folded (``H_PAD == H``): rows of several query tokens share one tile, so the request's KV is
  read once for all of them. This matters when H is small (16 heads under TP8) and q_len > 1
  (speculative decoding): unfolded, a 16-head tile is a quarter-full 64-row MMA and the KV is
  read q_len times.
* Unfolded (``H_PAD`` = H rounded up to BLOCK_M): every tile holds one query token's heads.
Causal masking is per row (each row knows its token), so one kernel body serves both, and
ragged prefill in absorbed form is the same kernel with per-request query counts.

Split-KV: grid axis 2 cuts a request's keys into num_splits contiguous, BLOCK_N-aligned ranges;
each writes an unnormalised-free partial (O / l, log2-LSE) that `_combine_kernel` merges. The
ranges depend only on the request's length, so every row tile of a request agrees on them.
"""

from __future__ import annotations

from .._triton import HAS_TRITON

if HAS_TRITON:
    from .._triton import tl, triton

    @triton.jit
    def _mla_attn_split_kernel(
        Q, CLat, CRope, CScale, PageTable, SeqLens, QStart,
        Out, LseOut, PartO, PartLse,
        stride_qt, stride_qh,
        stride_lat_tok, stride_rope_tok,
        stride_pt_b,
        stride_ot, stride_oh,
        stride_pot, stride_poh, stride_pos,
        num_heads, heads_padded, qk_scale_log2, num_splits,
        PAGE_SIZE: tl.constexpr,
        DIRECT_OUT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SWAP_AB: tl.constexpr,
        IS_FP8: tl.constexpr,
        WRITE_LSE: tl.constexpr,
        DOT_DTYPE: tl.constexpr,
    ):
        # DOT_DTYPE is bf16 on GPUs; fp32 under TRITON_INTERPRET, whose bf16 dot is wrong (3.9).
        D_LAT: tl.constexpr = 512
        D_ROPE: tl.constexpr = 64
        b = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_s = tl.program_id(2)

        q_start = tl.load(QStart + b)
        q_len = tl.load(QStart + b + 1) - q_start
        kv_len = tl.load(SeqLens + b)
        row0 = pid_m * BLOCK_M
        if row0 >= q_len * heads_padded:
            return
        rows = row0 + tl.arange(0, BLOCK_M)
        q_idx = rows // heads_padded
        head = rows % heads_padded
        row_ok = (q_idx < q_len) & (head < num_heads)
        # Bottom-right causal: query i sees keys < kv_len - q_len + i + 1.
        row_end = kv_len - q_len + q_idx + 1
        last_q = tl.minimum((row0 + BLOCK_M - 1) // heads_padded, q_len - 1)
        tile_end = kv_len - q_len + last_q + 1

        per_split = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
        start = pid_s * per_split
        end = tl.minimum(start + per_split, tile_end)

        tok = (q_start + q_idx).to(tl.int64)
        d = tl.arange(0, D_LAT)
        r = tl.arange(0, D_ROPE)
        q_base = Q + tok[:, None] * stride_qt + head[:, None] * stride_qh
        q_lat = tl.load(q_base + d[None, :], mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
        q_rope = tl.load(q_base + D_LAT + r[None, :], mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        pt_row = PageTable + b.to(tl.int64) * stride_pt_b
        if SWAP_AB:
            # Keys on the MMA's M axis, query rows on N: S^T = K Q^T and O^T = K^T P^T. The
            # 512-wide latent and the key block fill the M tile however few rows there are,
            # and the loop-invariant Q sits in shared memory as the B operand, not in registers.
            q_lat_t = tl.trans(q_lat)
            q_rope_t = tl.trans(q_rope)
            acc_t = tl.zeros([D_LAT, BLOCK_M], dtype=tl.float32)
            for n0 in range(start, end, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                n_ok = offs_n < end
                page = tl.load(pt_row + offs_n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
                slot = page * PAGE_SIZE + offs_n % PAGE_SIZE
                k_lat = tl.load(CLat + slot[:, None] * stride_lat_tok + d[None, :], mask=n_ok[:, None], other=0.0)
                k_rope = tl.load(CRope + slot[:, None] * stride_rope_tok + r[None, :], mask=n_ok[:, None], other=0.0)
                k_lat = k_lat.to(DOT_DTYPE)
                st = tl.dot(k_lat, q_lat_t)
                if IS_FP8:
                    k_scale = tl.load(CScale + slot, mask=n_ok, other=0.0)
                    st = st * k_scale[:, None]
                st = tl.dot(k_rope.to(DOT_DTYPE), q_rope_t, st)
                st = st * qk_scale_log2
                st = tl.where(offs_n[:, None] < row_end[None, :], st, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(st, axis=0))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                pt = tl.exp2(st - m_use[None, :])
                l_i = l_i * alpha + tl.sum(pt, axis=0)
                if IS_FP8:
                    pt = pt * k_scale[:, None]
                acc_t = tl.dot(tl.trans(k_lat), pt.to(DOT_DTYPE), acc_t * alpha[None, :])
                m_i = m_new
            acc = tl.trans(acc_t)
        else:
            acc = tl.zeros([BLOCK_M, D_LAT], dtype=tl.float32)
            for n0 in range(start, end, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                n_ok = offs_n < end
                page = tl.load(pt_row + offs_n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
                slot = page * PAGE_SIZE + offs_n % PAGE_SIZE
                k_lat = tl.load(CLat + slot[:, None] * stride_lat_tok + d[None, :], mask=n_ok[:, None], other=0.0)
                k_rope = tl.load(CRope + slot[:, None] * stride_rope_tok + r[None, :], mask=n_ok[:, None], other=0.0)
                k_lat = k_lat.to(DOT_DTYPE)
                s = tl.dot(q_lat, tl.trans(k_lat))
                if IS_FP8:
                    # Per-token scale: scores and probabilities take it, the MMA sees raw e4m3.
                    k_scale = tl.load(CScale + slot, mask=n_ok, other=0.0)
                    s = s * k_scale[None, :]
                s = tl.dot(q_rope, tl.trans(k_rope.to(DOT_DTYPE)), s)
                s = s * qk_scale_log2
                s = tl.where(offs_n[None, :] < row_end[:, None], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                p = tl.exp2(s - m_use[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                if IS_FP8:
                    p = p * k_scale[None, :]
                acc = tl.dot(p.to(DOT_DTYPE), k_lat, acc * alpha[:, None])
                m_i = m_new

        empty = l_i == 0.0
        o = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        if DIRECT_OUT:  # one split: no combine step, write the output itself
            o_ptr = Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
            tl.store(o_ptr, o.to(Out.dtype.element_ty), mask=row_ok[:, None])
            if WRITE_LSE:
                tl.store(LseOut + tok * num_heads + head, lse2 * 0.6931471805599453, mask=row_ok)
        else:
            po = PartO + tok[:, None] * stride_pot + head[:, None] * stride_poh + pid_s * stride_pos + d[None, :]
            tl.store(po, o, mask=row_ok[:, None])
            tl.store(PartLse + (tok * num_heads + head) * num_splits + pid_s, lse2, mask=row_ok)

    @triton.jit
    def _combine_kernel(
        PartO, PartLse, Out, LseOut,
        stride_pot, stride_poh, stride_pos,
        stride_ot, stride_oh,
        num_heads, num_splits,
        SPLITS_POW2: tl.constexpr,
        WRITE_LSE: tl.constexpr,
    ):
        # One program per (token, head): merge the splits' partial outputs by their LSE weights.
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        s_idx = tl.arange(0, SPLITS_POW2)
        row = t * num_heads + h
        lse = tl.load(PartLse + row * num_splits + s_idx, mask=s_idx < num_splits, other=float("-inf"))
        m = tl.max(lse, axis=0)
        m_use = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(lse - m_use)
        denom = tl.sum(w, axis=0)
        d = tl.arange(0, 512)
        acc = tl.zeros([512], dtype=tl.float32)
        base = PartO + t * stride_pot + h * stride_poh
        for s in range(num_splits):
            w_s = tl.exp2(tl.load(PartLse + row * num_splits + s) - m_use)
            acc += w_s * tl.load(base + s * stride_pos + d)
        o = acc / tl.where(denom == 0.0, 1.0, denom)
        tl.store(Out + t * stride_ot + h * stride_oh + d, o.to(Out.dtype.element_ty))
        if WRITE_LSE:
            lse_nat = tl.where(denom == 0.0, float("-inf"), (m_use + tl.log2(denom)) * 0.6931471805599453)
            tl.store(LseOut + row, lse_nat)

    @triton.jit
    def _combine_blocked_kernel(
        PartO, PartLse, Out, LseOut,
        stride_pot, stride_poh, stride_pos,
        stride_ot, stride_oh,
        num_heads, num_splits,
        SPLITS_POW2: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
        WRITE_LSE: tl.constexpr,
    ):
        # One program per (token, head, BLOCK_D output columns); BLOCK_S splits' partials per load, so the
        # loads of many splits are in flight at once (the serial loop above waits on one 2 KB load a split:
        # at 128 splits, the common batch-1 plan, that latency chain is the combine's whole time).
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        row = t * num_heads + h
        s_all = tl.arange(0, SPLITS_POW2)
        lse_all = tl.load(PartLse + row * num_splits + s_all, mask=s_all < num_splits, other=float("-inf"))
        m = tl.max(lse_all, axis=0)
        m_use = tl.where(m == float("-inf"), 0.0, m)
        denom = tl.sum(tl.exp2(lse_all - m_use), axis=0)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        base = PartO + t * stride_pot + h * stride_poh
        for s0 in range(0, num_splits, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            ok = s < num_splits
            w = tl.exp2(tl.load(PartLse + row * num_splits + s, mask=ok, other=float("-inf")) - m_use)
            part = tl.load(base + s[:, None] * stride_pos + d[None, :], mask=ok[:, None], other=0.0)
            acc += tl.sum(w[:, None] * part, axis=0)
        o = acc / tl.where(denom == 0.0, 1.0, denom)
        tl.store(Out + t * stride_ot + h * stride_oh + d, o.to(Out.dtype.element_ty))
        if WRITE_LSE:
            if tl.program_id(2) == 0:
                lse_nat = tl.where(denom == 0.0, float("-inf"), (m_use + tl.log2(denom)) * 0.6931471805599453)
                tl.store(LseOut + row, lse_nat)
