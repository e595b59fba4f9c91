"""Non-absorbed MLA prefill: ragged causal flash attention, q/k head dim 128 + 64 (rope), v 128.

MLA's rope key is one 64-wide vector per token shared by all heads, so the kernel takes it as
[Tk, 64] and adds its dot product to the no-rope one instead of reading a broadcast copy per head
(saves a third of the key bytes and the concatenation). Bottom-right causal: a request's new
tokens are the last of its keys. Blocks wholly below the diagonal skip the mask (first loop);
only the diagonal band pays for it (second loop). Query blocks run longest-first (pid 0 reversed)
so the causal triangle's heavy blocks start early and the tail of the grid is short.
"""

from __future__ import annotations

from .._triton import HAS_TRITON

if HAS_TRITON:
    from .._triton import tl, triton

    @triton.jit
    def _attend_block(
        acc, m_i, l_i, q_nope, q_rope, kn_ptrs, kr_ptrs, v_ptrs, n0, k_len, row_end,
        stride_knt, stride_krt, stride_vt, qk_scale_log2,
        BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT_DTYPE: tl.constexpr,
    ):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if MASKED:
            n_ok = offs_n < k_len
            k_nope = tl.load(kn_ptrs + n0 * stride_knt, mask=n_ok[:, None], other=0.0)
            k_rope = tl.load(kr_ptrs + n0 * stride_krt, mask=n_ok[:, None], other=0.0)
            v = tl.load(v_ptrs + n0 * stride_vt, mask=n_ok[:, None], other=0.0)
        else:
            k_nope = tl.load(kn_ptrs + n0 * stride_knt)
            k_rope = tl.load(kr_ptrs + n0 * stride_krt)
            v = tl.load(v_ptrs + n0 * stride_vt)
        s = tl.dot(q_nope, tl.trans(k_nope.to(DOT_DTYPE)))
        s = tl.dot(q_rope, tl.trans(k_rope.to(DOT_DTYPE)), s)
        s = s * qk_scale_log2
        if MASKED:
            s = tl.where(offs_n[None, :] < row_end[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = m_new
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc * alpha[:, None])
        return acc, m_new, l_i

    @triton.jit
    def _mla_prefill_kernel(
        QN, QR, KN, KR, V, Out, Lse, CuQ, CuK,
        stride_qnt, stride_qnh, stride_qrt, stride_qrh,
        stride_knt, stride_knh, stride_krt,
        stride_vt, stride_vh, stride_ot, stride_oh,
        num_heads, num_m_blocks, qk_scale_log2,
        D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, D_V: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        WRITE_LSE: tl.constexpr, DOT_DTYPE: tl.constexpr,
    ):
        m_blk = num_m_blocks - 1 - tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2)
        q0 = tl.load(CuQ + b)
        q_len = tl.load(CuQ + b + 1) - q0
        k0 = tl.load(CuK + b)
        k_len = tl.load(CuK + b + 1) - k0
        if m_blk * BLOCK_M < q_len:
            offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
            m_ok = offs_m < q_len
            prefix = k_len - q_len
            row_end = prefix + offs_m + 1  # exclusive key bound per query row
            dn = tl.arange(0, D_NOPE)
            dr = tl.arange(0, D_ROPE)
            dv = tl.arange(0, D_V)
            tok = (q0 + offs_m).to(tl.int64)
            q_nope = tl.load(QN + tok[:, None] * stride_qnt + h * stride_qnh + dn[None, :],
                             mask=m_ok[:, None], other=0.0).to(DOT_DTYPE)
            q_rope = tl.load(QR + tok[:, None] * stride_qrt + h * stride_qrh + dr[None, :],
                             mask=m_ok[:, None], other=0.0).to(DOT_DTYPE)
            offs_n = tl.arange(0, BLOCK_N)
            krow = (k0 + offs_n).to(tl.int64)
            kn_ptrs = KN + krow[:, None] * stride_knt + h * stride_knh + dn[None, :]
            kr_ptrs = KR + krow[:, None] * stride_krt + dr[None, :]
            v_ptrs = V + krow[:, None] * stride_vt + h * stride_vh + dv[None, :]

            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, D_V], dtype=tl.float32)
            # Keys every row of the block sees: below the first row's diagonal and inside k_len.
            full_end = (tl.minimum(prefix + m_blk * BLOCK_M + 1, k_len) // BLOCK_N) * BLOCK_N
            end = tl.minimum(k_len, prefix + tl.minimum((m_blk + 1) * BLOCK_M, q_len))
            for n0 in range(0, full_end, BLOCK_N):
                acc, m_i, l_i = _attend_block(acc, m_i, l_i, q_nope, q_rope, kn_ptrs, kr_ptrs, v_ptrs, n0, k_len,
                                              row_end, stride_knt, stride_krt, stride_vt, qk_scale_log2,
                                              BLOCK_N, False, DOT_DTYPE)
            for n0 in range(full_end, end, BLOCK_N):
                acc, m_i, l_i = _attend_block(acc, m_i, l_i, q_nope, q_rope, kn_ptrs, kr_ptrs, v_ptrs, n0, k_len,
                                              row_end, stride_knt, stride_krt, stride_vt, qk_scale_log2,
                                              BLOCK_N, True, DOT_DTYPE)
            empty = l_i == 0.0
            o = acc / tl.where(empty, 1.0, l_i)[:, None]
            tl.store(Out + tok[:, None] * stride_ot + h * stride_oh + dv[None, :], o.to(Out.dtype.element_ty),
                     mask=m_ok[:, None])
            if WRITE_LSE:
                lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
                tl.store(Lse + tok * num_heads + h, lse, mask=m_ok)
