"""Sampling kernels: penalties, seeded sampling (greedy / temperature / top-k / top-p / min-p),
log-probabilities. One program per row; every parameter is per row; no host sync.

Design note (sample). The reference keeps, per row, every token whose scaled logit is >= one
threshold (the last survivor of min-p, top-k and top-p applied to the descending order) and takes
the Gumbel-max argmax over survivors with the counter-based uniforms of `reference.rng`. Sorting a
150K vocabulary per row is what a GPU kernel wants to avoid, so the thresholds are found by
bisection over the order-preserving integer image of fp32 values (32 steps, each one pass over the
row, which stays in L2):
- top-k: the largest key K with count(key >= K) >= k, i.e. exactly the k-th largest value;
- top-p: the smallest key K with mass(candidates with key > K) < top_p; the first element of a run
  of equal values has exactly that mass before it, so K is exactly the reference's last survivor.
Results therefore match the reference token for token, except at exact ties (equal logits at the
top-k cut change the reference's renormalisation mass by which of them it sorted first) and at
1-ulp differences of exp/log between torch and Triton on a boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lightspeed_kernel.reference.rng import GOLDEN, TOKEN_SALT, row_keys  # noqa: F401  (same constants)

from ._common import FLOAT_DTYPES, check, register

MASK32 = 0xFFFFFFFF


@triton.jit
def _penalties_kernel(
    logits_ptr,
    counts_ptr,
    prompt_ptr,
    presence_ptr,
    frequency_ptr,
    repetition_ptr,
    vocab,
    stride_l,
    stride_c,
    stride_p,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    x = tl.load(logits_ptr + row * stride_l + cols, mask=mask, other=0.0)
    count = tl.load(counts_ptr + row * stride_c + cols, mask=mask, other=0)
    in_prompt = tl.load(prompt_ptr + row * stride_p + cols, mask=mask, other=0) != 0
    generated = count > 0
    rep = tl.load(repetition_ptr + row)
    penalised = tl.where(x > 0, tl.math.div_rn(x, rep), x * rep)
    x = tl.where(in_prompt | generated, penalised, x)
    x = x - tl.load(frequency_ptr + row) * count.to(tl.float32)
    x = x - tl.load(presence_ptr + row) * generated.to(tl.float32)
    tl.store(logits_ptr + row * stride_l + cols, x, mask=mask)


@register("sampling", "penalties", "triton_apply_penalties", (torch.float32,))
def apply_penalties(logits, output_counts, prompt_mask, presence, frequency, repetition):
    """logits: [S, V] fp32 (updated in place and returned); output_counts: [S, V] int32;
    prompt_mask: [S, V] bool; presence, frequency, repetition: [S] fp32 (repetition 1 = off)."""
    check(logits.dim() == 2 and logits.dtype == torch.float32, "logits must be fp32 [S, V]")
    s, v = logits.shape
    check(
        output_counts.shape == (s, v) and prompt_mask.shape == (s, v), "counts and prompt_mask must be [S, V]"
    )
    check(
        logits.stride(1) == 1 and output_counts.stride(1) == 1 and prompt_mask.stride(1) == 1,
        "rows must be contiguous",
    )
    if s == 0 or v == 0:
        return logits
    prompt = prompt_mask.view(torch.uint8) if prompt_mask.dtype == torch.bool else prompt_mask
    block = 1024
    _penalties_kernel[(s, triton.cdiv(v, block))](
        logits,
        output_counts,
        prompt,
        presence.float().contiguous(),
        frequency.float().contiguous(),
        repetition.float().contiguous(),
        v,
        logits.stride(0),
        output_counts.stride(0),
        prompt.stride(0),
        BLOCK=block,
        num_warps=4,
    )
    return logits


@triton.jit
def _mix32(x):
    # Wellons' lowbias32 on uint32 values held in int64; products wrap mod 2^64, low 32 bits exact
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _ordered_key(s):
    """fp32 -> int64 in [0, 2^32) with the order of the floats."""
    bits = s.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(bits >= 0, bits + 2147483648, 2147483647 - (bits & 0x7FFFFFFF))


@triton.jit
def _scaled(logits_row, cols, vocab, temp):
    # IEEE division (not the approximate one `/` compiles to): bit-identical to the reference's
    return tl.math.div_rn(tl.load(logits_row + cols, mask=cols < vocab, other=float("-inf")), temp)


@triton.jit
def _sample_kernel(
    logits_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    keys_ptr,
    out_ptr,
    vocab,
    stride_l,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * stride_l
    temperature = tl.load(temp_ptr + row)
    temp = tl.where(temperature <= 0.0, 1.0, temperature)
    offs = tl.arange(0, BLOCK)
    # pass 1: max of scaled logits, greedy argmax (first index of the max)
    s_max = tl.full([], float("-inf"), tl.float32)
    best_raw = tl.full([], float("-inf"), tl.float32)
    best_raw_idx = tl.zeros([], tl.int32)
    for c0 in range(0, vocab, BLOCK):
        cols = c0 + offs
        x = tl.load(logits_row + cols, mask=cols < vocab, other=float("-inf"))
        s_max = tl.maximum(s_max, tl.max(tl.math.div_rn(x, temp), axis=0))
        m = tl.max(x, axis=0)
        idx = tl.min(tl.where(x == m, cols, vocab), axis=0)
        take = m > best_raw
        best_raw_idx = tl.where(take, idx, best_raw_idx)
        best_raw = tl.where(take, m, best_raw)
    result = best_raw_idx.to(tl.int64)
    if temperature > 0.0:
        min_p = tl.load(min_p_ptr + row)
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        # top-k threshold: the k-th largest key (0 = off)
        thr_k = tl.zeros([], tl.int64)
        if (top_k > 0) & (top_k < vocab):
            lo = tl.zeros([], tl.int64)
            hi = tl.zeros([], tl.int64) + 4294967295
            for _ in range(32):
                mid = (lo + hi + 1) // 2
                count = tl.zeros([], tl.int32)
                for c0 in range(0, vocab, BLOCK):
                    cols = c0 + offs
                    key = _ordered_key(_scaled(logits_row, cols, vocab, temp))
                    count += tl.sum(((key >= mid) & (cols < vocab)).to(tl.int32), axis=0)
                ok = count >= top_k
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid - 1)
            thr_k = lo
        thr = thr_k
        if top_p < 1.0:
            z = tl.zeros([], tl.float32)
            for c0 in range(0, vocab, BLOCK):
                cols = c0 + offs
                s = _scaled(logits_row, cols, vocab, temp)
                e = tl.exp(s - s_max)
                cand = (e >= min_p) & (_ordered_key(s) >= thr_k) & (cols < vocab)
                z += tl.sum(tl.where(cand, e, 0.0), axis=0)
            lo = thr_k
            hi = _ordered_key(s_max)
            for _ in range(32):
                mid = (lo + hi) // 2
                mass = tl.zeros([], tl.float32)
                for c0 in range(0, vocab, BLOCK):
                    cols = c0 + offs
                    s = _scaled(logits_row, cols, vocab, temp)
                    e = tl.exp(s - s_max)
                    key = _ordered_key(s)
                    above = (e >= min_p) & (key >= thr_k) & (key > mid) & (cols < vocab)
                    mass += tl.sum(tl.where(above, e / z, 0.0), axis=0)
                ok = mass < top_p
                hi = tl.where(ok, mid, hi)
                lo = tl.where(ok, lo, tl.minimum(mid + 1, hi))  # converged: stay on hi
            thr = tl.maximum(thr, lo)
        # Gumbel-max race over survivors with uniforms hashed from (row key, token)
        row_key = tl.load(keys_ptr + row)
        best = tl.full([], float("-inf"), tl.float32)
        best_idx = tl.zeros([], tl.int32)
        for c0 in range(0, vocab, BLOCK):
            cols = c0 + offs
            s = _scaled(logits_row, cols, vocab, temp)
            keep = (tl.exp(s - s_max) >= min_p) & (_ordered_key(s) >= thr) & (cols < vocab)
            bits = _mix32(_mix32(cols.to(tl.int64) ^ row_key) ^ 0x85EBCA6B)
            u = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
            race = tl.where(keep, s - tl.log(-tl.log(u)), float("-inf"))
            m = tl.max(race, axis=0)
            idx = tl.min(tl.where(race == m, cols, vocab), axis=0)
            take = m > best
            best_idx = tl.where(take, idx, best_idx)
            best = tl.where(take, m, best)
        result = best_idx.to(tl.int64)
    tl.store(out_ptr + row, result)


def _token_output(logits: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The int64 [S] token output for logits [S, V] (checked; `out` when given), and the logits with unit column
    stride."""
    check(logits.dim() == 2, "logits must be [S, V]")
    check(logits.shape[0] == 0 or logits.shape[1] > 0, "empty vocabulary")
    if out is None:
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    check(out.shape == (logits.shape[0],) and out.dtype == torch.int64 and out.is_contiguous(),
          "out must be contiguous int64 [S]")
    return out, (logits if logits.stride(1) == 1 else logits.contiguous())


@register("sampling", "sample", "triton_sample", FLOAT_DTYPES)
def sample(logits, temperature, top_k, top_p, min_p, seeds, offsets):
    """logits: [S, V] fp32; temperature, top_p, min_p: [S] fp32; top_k: [S] int32; seeds, offsets:
    [S] int64 -> token ids int64 [S]. temperature <= 0 = greedy; top_k <= 0, top_p = 1, min_p = 0 = off."""
    out, logits = _token_output(logits.float())
    s, v = logits.shape
    if s == 0:
        return out
    keys = row_keys(seeds.to(logits.device), offsets.to(logits.device)).contiguous()  # [S] uint32 in int64
    _sample_kernel[(s,)](
        logits,
        temperature.float().contiguous(),
        top_k.to(torch.int32).contiguous(),
        top_p.float().contiguous(),
        min_p.float().contiguous(),
        keys,
        out,
        v,
        logits.stride(0),
        BLOCK=min(4096, triton.next_power_of_2(v)),
        num_warps=8,
    )
    return out


# Greedy decoding reads a whole logits row for one index. torch's argmax reduces a row in one block
# (27 us a step for a 128K vocabulary at batch 1 on the H200, bench/results/h200_pdl_2026-12-03_1800/
# trace_pdl0/), so the row is cut into chunks, one program each, and a second launch picks among
# the chunks' winners.
GREEDY_CHUNK = 4096


@triton.jit
def _greedy_key(x):
    """torch.argmax's order as an int64: NaN above every number (2^32), -0.0 equal to 0.0."""
    return tl.where(x != x, 4294967296, _ordered_key(tl.where(x == 0.0, 0.0, x)))


@triton.jit
def _greedy_chunk_kernel(logits_ptr, key_ptr, idx_ptr, out_ptr, vocab, stride_l, chunks,
                         BLOCK: tl.constexpr, ONE_CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    valid = cols < vocab
    x = tl.load(logits_ptr + row * stride_l + cols, mask=valid, other=0.0).to(tl.float32)
    key = tl.where(valid, _greedy_key(x), -1)
    best = tl.max(key, axis=0)
    first = tl.min(tl.where(key == best, cols, vocab), axis=0)
    if ONE_CHUNK:
        tl.store(out_ptr + row, first.to(tl.int64))
    else:
        tl.store(key_ptr + row * chunks + chunk, best)
        tl.store(idx_ptr + row * chunks + chunk, first)


@triton.jit
def _greedy_pick_kernel(key_ptr, idx_ptr, out_ptr, chunks, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    valid = c < chunks
    key = tl.load(key_ptr + row * chunks + c, mask=valid, other=-1)
    idx = tl.load(idx_ptr + row * chunks + c, mask=valid, other=2147483647)
    best = tl.max(key, axis=0)
    # chunks are in column order, so the smallest index among the tied winners is the row's first
    tl.store(out_ptr + row, tl.min(tl.where(key == best, idx, 2147483647), axis=0).to(tl.int64))


@register("sampling", "greedy", "triton_greedy", FLOAT_DTYPES)
def greedy(logits, out=None):
    """logits: [S, V] -> [S] int64 (into `out` when given), each row's first index of its maximum (torch.argmax's
    answer)."""
    out, logits = _token_output(logits, out)
    s, v = logits.shape
    if s == 0:
        return out
    chunks = triton.cdiv(v, GREEDY_CHUNK)
    block = min(GREEDY_CHUNK, triton.next_power_of_2(v))
    if chunks == 1:  # the chunk kernel writes the answer; no winners to keep
        keys, idx = out, out
    else:
        keys = torch.empty((s, chunks), dtype=torch.int64, device=logits.device)
        idx = torch.empty((s, chunks), dtype=torch.int32, device=logits.device)
    _greedy_chunk_kernel[(s, chunks)](logits, keys, idx, out, v, logits.stride(0), chunks,
                                      BLOCK=block, ONE_CHUNK=chunks == 1, num_warps=8)
    if chunks > 1:
        _greedy_pick_kernel[(s,)](keys, idx, out, chunks, BLOCK_C=triton.next_power_of_2(chunks), num_warps=1)
    return out


@triton.jit
def _logsumexp_kernel(logits_ptr, ids_ptr, lse_ptr, token_lp_ptr, vocab, stride_l, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    acc = tl.zeros([], tl.float32)
    for c0 in range(0, vocab, BLOCK):
        cols = c0 + offs
        x = tl.load(logits_ptr + row * stride_l + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        acc = acc * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(acc)
    tl.store(lse_ptr + row, lse)
    tok = tl.load(ids_ptr + row)
    tl.store(token_lp_ptr + row, tl.load(logits_ptr + row * stride_l + tok).to(tl.float32) - lse)


@register("sampling", "logprobs", "triton_compute_logprobs", (torch.float32, torch.bfloat16, torch.float16))
def compute_logprobs(logits, token_ids, top_n: int):
    """logits: [S, V]; token_ids: [S] -> (token_logprob fp32 [S], top_ids int64 [S, top_n],
    top_logprobs fp32 [S, top_n]) in descending order. One streaming pass computes the log-sum-exp;
    the top entries are the top logits (log-softmax is monotone) minus it."""
    check(logits.dim() == 2 and token_ids.shape == (logits.shape[0],), "logits [S, V], token_ids [S]")
    s, v = logits.shape
    lse = torch.empty(s, dtype=torch.float32, device=logits.device)
    token_lp = torch.empty(s, dtype=torch.float32, device=logits.device)
    if s and v:
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        _logsumexp_kernel[(s,)](
            logits,
            token_ids.contiguous(),
            lse,
            token_lp,
            v,
            logits.stride(0),
            BLOCK=min(4096, triton.next_power_of_2(v)),
            num_warps=8,
        )
    top_vals, top_ids = logits.float().topk(top_n, dim=-1)
    return token_lp, top_ids, top_vals - lse[:, None]
