/* Weight-only quantised GEMV / GEMM on the CPU: fp32 activations, 4- or 8-bit weights.
 *
 * Design note. A decode step reads every weight once and does two flops per weight per token, so
 * with one token (GEMV) the step is bound by how fast weights stream in and turn into fp32, and
 * with 2..16 tokens (batched decode) by the multiplies. Up to 8 token rows, the kernels read the
 * packed weight once per tile of up to TILE_T rows and expand one 32-column block to fp32 in
 * registers; from panel_min_rows rows (9 by measurement) the panel path dequantises two weight rows
 * at a time into an L1 scratch and runs a register-blocked micro-kernel over every token row (its
 * comment says why). Long prompts (many rows) are better served by a vendor GEMM on
 * weights dequantised once per call (`ls_wq_dequant`), which the Python launcher picks.
 *
 * Weight format, for output row n and input column k, group g = k >> shift (group = 1 << shift):
 *     w[n, k] = scales[n, g] * q[n, k] + mins[n, g]            (mins NULL: 0)
 *   bits 4: q in 0..15, two per byte, K/2 bytes per row. In each 32-column block, byte j holds
 *           column j in its low nibble and column j + 16 in its high nibble (GGUF's Q4 order).
 *   bits 8: q in -128..127, one int8 per column.
 * group >= 16 is a power of two dividing K; K is a multiple of 32 (the launcher checks, and the
 * entry points return 2 otherwise). Threads: OpenMP over output rows, in the OpenMP runtime torch
 * itself loaded, so the kernels share torch's threads instead of starting a second pool.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "simd.h"

#define INLINE static inline __attribute__((always_inline))
#define TILE_T 8               /* token rows sharing one expansion of a weight block */
#define PAR_MIN_WORK (1 << 16) /* weights x rows below which one thread beats a fork/join */

static int log2_exact(int64_t v) {
    int s = 0;
    while ((1LL << s) < v) ++s;
    return (1LL << s) == v ? s : -1;
}

/* ---- scalar definition of the format (the portable path) ------------------------------------ */

INLINE float code_at(int bits, const uint8_t *row, int64_t k) {
    if (bits == 8) return (float)((const int8_t *)row)[k];
    const uint8_t byte = row[(k / 32) * 16 + (k % 16)];
    return (float)((k % 32) < 16 ? (byte & 15) : (byte >> 4));
}

INLINE void dequant_row_scalar(int bits, const uint8_t *row, const float *sc, const float *mn, int64_t K,
                               int shift, float *out) {
    for (int64_t k = 0; k < K; ++k) out[k] = sc[k >> shift] * code_at(bits, row, k) + (mn ? mn[k >> shift] : 0.0f);
}

#ifdef LS_AVX2

/* The 32 codes of block b as four fp32 vectors: columns 0-7, 8-15, 16-23, 24-31.
 * 4 bits: the 16 bytes go to both 128-bit lanes and one in-lane shuffle puts bytes 0-7 (8-15) in
 * the low byte of eight 32-bit lanes; the low nibble (and) is columns 0-7, the high one (shift)
 * columns 16-23. 8 bits: sign-extending loads straight from memory. */
INLINE void expand_block(int bits, const uint8_t *row, int64_t b, __m256 q[4]) {
    if (bits == 8) {
        const int8_t *p = (const int8_t *)row + b * 32;
        for (int i = 0; i < 4; ++i)
            q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * i))));
        return;
    }
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(row + b * 16)));
    const __m256i spread_lo = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                               4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i spread_hi = _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,
                                               12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1);
    const __m256i mask = _mm256_set1_epi32(15);
    const __m256i lo = _mm256_shuffle_epi8(bytes, spread_lo), hi = _mm256_shuffle_epi8(bytes, spread_hi);
    q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(lo, mask));
    q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(hi, mask));
    q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4));
    q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4));
}

/* Block b as fp32 weights: scale and min applied (the two 16-column halves may differ: group 16). */
INLINE void weight_block(int bits, const uint8_t *row, const float *sc, const float *mn, int shift, int64_t b,
                         __m256 w[4]) {
    expand_block(bits, row, b, w);
    const int64_t g_lo = (b * 32) >> shift, g_hi = (b * 32 + 16) >> shift;
    const __m256 s_lo = _mm256_set1_ps(sc[g_lo]), s_hi = _mm256_set1_ps(sc[g_hi]);
    const __m256 m_lo = _mm256_set1_ps(mn ? mn[g_lo] : 0.0f), m_hi = _mm256_set1_ps(mn ? mn[g_hi] : 0.0f);
    w[0] = _mm256_fmadd_ps(w[0], s_lo, m_lo);
    w[1] = _mm256_fmadd_ps(w[1], s_lo, m_lo);
    w[2] = _mm256_fmadd_ps(w[2], s_hi, m_hi);
    w[3] = _mm256_fmadd_ps(w[3], s_hi, m_hi);
}

INLINE void dequant_row(int bits, const uint8_t *row, const float *sc, const float *mn, int64_t K, int shift,
                        float *out) {
    for (int64_t b = 0; b < K / 32; ++b) {
        __m256 w[4];
        weight_block(bits, row, sc, mn, shift, b, w);
        for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + b * 32 + 8 * i, w[i]);
    }
}

/* One token row: sum_k (s q + m) x = sum_g s_g (q . x)_g + sum_g m_g xsum_g. The codes are never
 * scaled one by one; the caller adds the mins term from per-group sums of x. Two blocks per
 * iteration into independent accumulators: the FMA latency chain bounds a single one. */
INLINE float dot_codes(int bits, const uint8_t *row, const float *sc, int64_t K, int shift, const float *x) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t blocks = K / 32;
    int64_t b = 0;
    for (; b + 1 < blocks; b += 2) {
        __m256 q[4], r[4];
        expand_block(bits, row, b, q);
        expand_block(bits, row, b + 1, r);
        const float *xb = x + b * 32;
        __m256 lo0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb)), hi0 = _mm256_mul_ps(q[2], _mm256_loadu_ps(xb + 16));
        __m256 lo1 = _mm256_mul_ps(r[0], _mm256_loadu_ps(xb + 32)), hi1 = _mm256_mul_ps(r[2], _mm256_loadu_ps(xb + 48));
        lo0 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), lo0);
        hi0 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), hi0);
        lo1 = _mm256_fmadd_ps(r[1], _mm256_loadu_ps(xb + 40), lo1);
        hi1 = _mm256_fmadd_ps(r[3], _mm256_loadu_ps(xb + 56), hi1);
        if (shift >= 5) { /* one scale per block */
            acc0 = _mm256_fmadd_ps(_mm256_add_ps(lo0, hi0), _mm256_set1_ps(sc[(b * 32) >> shift]), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_add_ps(lo1, hi1), _mm256_set1_ps(sc[(b * 32 + 32) >> shift]), acc1);
        } else { /* group 16: one scale per half block */
            acc0 = _mm256_fmadd_ps(lo0, _mm256_set1_ps(sc[2 * b]), acc0);
            acc1 = _mm256_fmadd_ps(hi0, _mm256_set1_ps(sc[2 * b + 1]), acc1);
            acc0 = _mm256_fmadd_ps(lo1, _mm256_set1_ps(sc[2 * b + 2]), acc0);
            acc1 = _mm256_fmadd_ps(hi1, _mm256_set1_ps(sc[2 * b + 3]), acc1);
        }
    }
    for (; b < blocks; ++b) {
        __m256 q[4];
        expand_block(bits, row, b, q);
        const float *xb = x + b * 32;
        const __m256 lo = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), _mm256_mul_ps(q[0], _mm256_loadu_ps(xb)));
        const __m256 hi = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), _mm256_mul_ps(q[2], _mm256_loadu_ps(xb + 16)));
        acc0 = _mm256_fmadd_ps(lo, _mm256_set1_ps(sc[(b * 32) >> shift]), acc0);
        acc1 = _mm256_fmadd_ps(hi, _mm256_set1_ps(sc[(b * 32 + 16) >> shift]), acc1);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* dot_codes of two weight rows at once: two independent streams sharing the loads of x, so
 * half the per-row loop overhead and twice the work in flight (about +20% on one core). */
INLINE void dot_codes2_fixed(int bits, const uint8_t *row0, const uint8_t *row1, const float *sc0,
                             const float *sc1, int64_t K, const int shift, const float *x, float *out) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 32; ++b) {
        __m256 q[4], r[4];
        expand_block(bits, row0, b, q);
        expand_block(bits, row1, b, r);
        const float *xb = x + b * 32;
        const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        if (shift >= 5) { /* one scale per block: one FMA chain per row through the block */
            __m256 t0 = _mm256_fmadd_ps(q[1], x1, _mm256_mul_ps(q[0], x0));
            __m256 t1 = _mm256_fmadd_ps(r[1], x1, _mm256_mul_ps(r[0], x0));
            t0 = _mm256_fmadd_ps(q[3], x3, _mm256_fmadd_ps(q[2], x2, t0));
            t1 = _mm256_fmadd_ps(r[3], x3, _mm256_fmadd_ps(r[2], x2, t1));
            acc0 = _mm256_fmadd_ps(t0, _mm256_set1_ps(sc0[(b * 32) >> shift]), acc0);
            acc1 = _mm256_fmadd_ps(t1, _mm256_set1_ps(sc1[(b * 32) >> shift]), acc1);
        } else { /* group 16: the two halves of the block have their own scales */
            const __m256 lo0 = _mm256_fmadd_ps(q[1], x1, _mm256_mul_ps(q[0], x0));
            const __m256 hi0 = _mm256_fmadd_ps(q[3], x3, _mm256_mul_ps(q[2], x2));
            const __m256 lo1 = _mm256_fmadd_ps(r[1], x1, _mm256_mul_ps(r[0], x0));
            const __m256 hi1 = _mm256_fmadd_ps(r[3], x3, _mm256_mul_ps(r[2], x2));
            const __m256 s0 = _mm256_fmadd_ps(hi0, _mm256_set1_ps(sc0[2 * b + 1]), _mm256_mul_ps(lo0, _mm256_set1_ps(sc0[2 * b])));
            const __m256 s1 = _mm256_fmadd_ps(hi1, _mm256_set1_ps(sc1[2 * b + 1]), _mm256_mul_ps(lo1, _mm256_set1_ps(sc1[2 * b])));
            acc0 = _mm256_add_ps(acc0, s0);
            acc1 = _mm256_add_ps(acc1, s1);
        }
    }
    out[0] = hsum8(acc0);
    out[1] = hsum8(acc1);
}

/* Groups of 32 (every GGUF 32-block type) get a copy with the group arithmetic folded away. */
INLINE void dot_codes2(int bits, const uint8_t *row0, const uint8_t *row1, const float *sc0, const float *sc1,
                       int64_t K, int shift, const float *x, float *out) {
    if (shift == 5)
        dot_codes2_fixed(bits, row0, row1, sc0, sc1, K, 5, x, out);
    else
        dot_codes2_fixed(bits, row0, row1, sc0, sc1, K, shift, x, out);
}

INLINE float dot_f32(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

/* nt (a constant at each call site, so the accumulators stay in registers) token rows of x
 * (row stride K) against one weight row. Up to 4 rows: two accumulators per row halve the FMA
 * chains; 5 to 8 rows: one each, their count alone hides the FMA latency. */
INLINE void dot_rows_fixed(int bits, const uint8_t *row, const float *sc, const float *mn, int64_t K, int shift,
                           const float *x, const int nt, float *out) {
    __m256 a[TILE_T], c[TILE_T];
    for (int t = 0; t < TILE_T; ++t) a[t] = c[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 32; ++b) {
        __m256 w[4];
        weight_block(bits, row, sc, mn, shift, b, w);
        for (int t = 0; t < nt; ++t) {
            const float *xb = x + t * K + b * 32;
            if (nt <= 4) {
                a[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xb), a[t]);
                c[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), c[t]);
                a[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), a[t]);
                c[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), c[t]);
            } else {
                a[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xb), a[t]);
                a[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), a[t]);
                a[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), a[t]);
                a[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), a[t]);
            }
        }
    }
    for (int t = 0; t < nt; ++t) out[t] = hsum8(nt <= 4 ? _mm256_add_ps(a[t], c[t]) : a[t]);
}

INLINE void dot_rows(int bits, const uint8_t *row, const float *sc, const float *mn, int64_t K, int shift,
                     const float *x, int64_t nt, float *out) {
    switch (nt) {
        case 1: dot_rows_fixed(bits, row, sc, mn, K, shift, x, 1, out); break;
        case 2: dot_rows_fixed(bits, row, sc, mn, K, shift, x, 2, out); break;
        case 3: dot_rows_fixed(bits, row, sc, mn, K, shift, x, 3, out); break;
        case 4: dot_rows_fixed(bits, row, sc, mn, K, shift, x, 4, out); break;
        case 5: dot_rows_fixed(bits, row, sc, mn, K, shift, x, 5, out); break;
        case 6: dot_rows_fixed(bits, row, sc, mn, K, shift, x, 6, out); break;
        case 7: dot_rows_fixed(bits, row, sc, mn, K, shift, x, 7, out); break;
        default: dot_rows_fixed(bits, row, sc, mn, K, shift, x, 8, out); break;
    }
}

/* Decode batches of panel_min_rows+ token rows (the launcher's PANEL_MIN_ROWS): PANEL_ROWS weight rows dequantised once to an
 * fp32 scratch (L1-resident), then a register-blocked 2 x nt micro-kernel over tiles of up to
 * PANEL_TILE token rows. Why (measured on a Zen 3, 1 thread): the one-row-at-a-time kernel above
 * loads one x vector per FMA and chains four FMAs per accumulator per block, so at 16 rows it ran
 * at about 40% of the core's FMA peak; here each x load feeds two FMAs, the 12 accumulators are
 * independent chains, and the expansion is shared by every token row instead of 8. 2 x 6
 * accumulators + 2 weights + 1 x = 15 of the 16 ymm registers. */
#define PANEL_ROWS 2
#define PANEL_TILE 6
#define HAS_PANEL_PATH 1

INLINE void panel_dot_fixed(const float *w, int64_t K, const float *x, const int nt, float *out) {
    __m256 a0[PANEL_TILE], a1[PANEL_TILE];
    for (int t = 0; t < nt; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
    const float *w1 = w + K;
    for (int64_t k = 0; k < K; k += 8) {
        const __m256 v0 = _mm256_load_ps(w + k), v1 = _mm256_load_ps(w1 + k);
        for (int t = 0; t < nt; ++t) {
            /* in a register: left to itself the compiler folds this load into both FMAs, and 14
             * loads per 12 FMAs made the loop load-bound (about 10% slower) */
            __m256 xv = _mm256_loadu_ps(x + t * K + k);
            __asm__("" : "+x"(xv));
            a0[t] = _mm256_fmadd_ps(v0, xv, a0[t]);
            a1[t] = _mm256_fmadd_ps(v1, xv, a1[t]);
        }
    }
    for (int t = 0; t < nt; ++t) {
        out[t] = hsum8(a0[t]);
        out[PANEL_TILE + t] = hsum8(a1[t]);
    }
}

/* out[0][t], out[1][t] (row stride PANEL_TILE) = the two scratch rows w [2, K] against x [nt, K].
 * Not inlined: inside the panel loop the dequantiser's constants kept ymm registers busy and one
 * accumulator went through the stack every iteration (about 1.5x slower at 6 rows). */
__attribute__((noinline)) static void panel_dot(const float *w, int64_t K, const float *x, int64_t nt, float *out) {
    switch (nt) {
        case 1: panel_dot_fixed(w, K, x, 1, out); break;
        case 2: panel_dot_fixed(w, K, x, 2, out); break;
        case 3: panel_dot_fixed(w, K, x, 3, out); break;
        case 4: panel_dot_fixed(w, K, x, 4, out); break;
        case 5: panel_dot_fixed(w, K, x, 5, out); break;
        default: panel_dot_fixed(w, K, x, 6, out); break;
    }
}

#define HAS_ONE_ROW_PATH 1

#else /* portable: dequantise the row to the stack, then dot products the compiler vectorises */

INLINE void dequant_row(int bits, const uint8_t *row, const float *sc, const float *mn, int64_t K, int shift,
                        float *out) {
    dequant_row_scalar(bits, row, sc, mn, K, shift, out);
}

INLINE void dot_rows(int bits, const uint8_t *row, const float *sc, const float *mn, int64_t K, int shift,
                     const float *x, int64_t nt, float *out) {
    float w[K];
    dequant_row_scalar(bits, row, sc, mn, K, shift, w);
    for (int64_t t = 0; t < nt; ++t) {
        float s = 0.0f;
        for (int64_t k = 0; k < K; ++k) s += w[k] * x[t * K + k];
        out[t] = s;
    }
}

INLINE float dot_codes(int bits, const uint8_t *row, const float *sc, int64_t K, int shift, const float *x) {
    (void)bits, (void)row, (void)sc, (void)K, (void)shift, (void)x;
    return 0.0f; /* never called: HAS_ONE_ROW_PATH is 0 */
}

INLINE void dot_codes2(int bits, const uint8_t *row0, const uint8_t *row1, const float *sc0, const float *sc1,
                       int64_t K, int shift, const float *x, float *out) {
    (void)bits, (void)row0, (void)row1, (void)sc0, (void)sc1, (void)K, (void)shift, (void)x, (void)out;
}

INLINE float dot_f32(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

INLINE void panel_dot(const float *w, int64_t K, const float *x, int64_t nt, float *out) {
    (void)w, (void)K, (void)x, (void)nt, (void)out; /* never called: HAS_PANEL_PATH is 0 */
}

#define HAS_ONE_ROW_PATH 0
#define HAS_PANEL_PATH 0
#define PANEL_ROWS 2
#define PANEL_TILE 6

#endif

/* The panel path of linear (T >= panel_min_rows): per pair of weight rows, dequantise both into
 * this thread's 64-byte aligned scratch (unaligned 32-byte loads that split cache lines cost the
 * micro-kernel a third of its speed), then the token rows in balanced tiles of <= PANEL_TILE. */
INLINE void dequant_panel(int bits, const uint8_t *qweight, const float *scales, const float *mins, int64_t K,
                          int shift, int64_t n0, int64_t rows, float *w) {
    const int64_t gpr = K >> shift, row_bytes = K * bits / 8;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = n0 + r;
        if (shift == 5) /* every GGUF 32-block type: the group arithmetic folded away */
            dequant_row(bits, qweight + n * row_bytes, scales + n * gpr, mins ? mins + n * gpr : NULL, K, 5, w + r * K);
        else
            dequant_row(bits, qweight + n * row_bytes, scales + n * gpr, mins ? mins + n * gpr : NULL, K, shift, w + r * K);
    }
    if (rows < PANEL_ROWS) memset(w + rows * K, 0, sizeof(float) * (size_t)((PANEL_ROWS - rows) * K));
}

INLINE int linear_panels(int bits, const float *x, int64_t T, int64_t K, const uint8_t *qweight, const float *scales,
                         const float *mins, int64_t N, int shift, const float *bias, float *out) {
    const int64_t panel = PANEL_ROWS * K; /* floats: a multiple of 64 bytes, as K is of 32 */
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    float *scratch = (float *)aligned_alloc(64, sizeof(float) * (size_t)(panel * threads));
    if (!scratch) return 1;
    const int64_t tiles = (T + PANEL_TILE - 1) / PANEL_TILE, per_tile = (T + tiles - 1) / tiles;
#pragma omp parallel for schedule(static) if (N * K * T >= PAR_MIN_WORK)
    for (int64_t n0 = 0; n0 < N; n0 += PANEL_ROWS) {
#ifdef _OPENMP
        float *w = scratch + panel * omp_get_thread_num();
#else
        float *w = scratch;
#endif
        const int64_t rows = N - n0 < PANEL_ROWS ? N - n0 : PANEL_ROWS;
        dequant_panel(bits, qweight, scales, mins, K, shift, n0, rows, w);
        for (int64_t t0 = 0; t0 < T; t0 += per_tile) {
            const int64_t nt = T - t0 < per_tile ? T - t0 : per_tile;
            float acc[PANEL_ROWS * PANEL_TILE];
            panel_dot(w, K, x + t0 * K, nt, acc);
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t t = 0; t < nt; ++t)
                    out[(t0 + t) * N + n0 + r] = acc[r * PANEL_TILE + t] + (bias ? bias[n0 + r] : 0.0f);
        }
    }
    free(scratch);
    return 0;
}

/* out[T, N] = x[T, K] @ w^T (+ bias); T >= panel_min_rows (>= 2) takes the panel path where the build
 * has it (the launcher holds the measured crossover). Returns 0, 2 for a bad shape / group, 1 if
 * malloc fails. */
INLINE int linear(int bits, const float *x, int64_t T, int64_t K, const uint8_t *qweight, const float *scales,
                  const float *mins, int64_t N, int64_t group, const float *bias, float *out, int64_t panel_min_rows) {
    const int shift = log2_exact(group);
    if (shift < 4 || K % 32 || K % group) return 2;
    const int64_t gpr = K / group, row_bytes = K * bits / 8;
    const int one_row = HAS_ONE_ROW_PATH && T == 1;
    float *xsum = NULL; /* per-group sums of x: the mins term of the one-row path */
    if (one_row && mins) {
        xsum = (float *)malloc(sizeof(float) * (size_t)gpr);
        if (!xsum) return 1;
        for (int64_t g = 0; g < gpr; ++g) {
            float s = 0.0f;
            for (int64_t j = 0; j < group; ++j) s += x[g * group + j];
            xsum[g] = s;
        }
    }
    if (one_row) { /* weight rows in pairs (dot_codes2), an odd last one alone */
#pragma omp parallel for schedule(static) if (N * K >= PAR_MIN_WORK)
        for (int64_t pair = 0; pair < (N + 1) / 2; ++pair) {
            const int64_t n = 2 * pair;
            float dots[2];
            if (n + 1 < N) {
                dot_codes2(bits, qweight + n * row_bytes, qweight + (n + 1) * row_bytes, scales + n * gpr,
                           scales + (n + 1) * gpr, K, shift, x, dots);
            } else {
                dots[0] = dot_codes(bits, qweight + n * row_bytes, scales + n * gpr, K, shift, x);
            }
            for (int64_t i = 0; i < 2 && n + i < N; ++i) {
                const float m_dot = mins ? dot_f32(mins + (n + i) * gpr, xsum, gpr) : 0.0f;
                out[n + i] = dots[i] + m_dot + (bias ? bias[n + i] : 0.0f);
            }
        }
        free(xsum);
        return 0;
    }
    if (HAS_PANEL_PATH && T >= panel_min_rows && T > 1) return linear_panels(bits, x, T, K, qweight, scales, mins, N, shift, bias, out);
#pragma omp parallel for schedule(static) if (N * K * T >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; ++n) {
        const uint8_t *row = qweight + n * row_bytes;
        const float *sc = scales + n * gpr, *mn = mins ? mins + n * gpr : NULL;
        const float b = bias ? bias[n] : 0.0f;
        float acc[TILE_T];
        for (int64_t t0 = 0; t0 < T; t0 += TILE_T) {
            const int64_t nt = T - t0 < TILE_T ? T - t0 : TILE_T;
            dot_rows(bits, row, sc, mn, K, shift, x + t0 * K, nt, acc);
            for (int64_t t = 0; t < nt; ++t) out[(t0 + t) * N + n] = acc[t] + b;
        }
    }
    free(xsum);
    return 0;
}

/* out[i, :] = dequantised weight row rows[i] (rows NULL: every row in order): embedding lookups
 * (a few rows) and long prompts (every row, then a vendor GEMM). Returns 0, or 2 for a bad group. */
INLINE int dequant(int bits, const uint8_t *qweight, const float *scales, const float *mins, int64_t K,
                   int64_t group, const int64_t *rows, int64_t nrows, float *out) {
    const int shift = log2_exact(group);
    if (shift < 4 || K % 32 || K % group) return 2;
    const int64_t gpr = K / group, row_bytes = K * bits / 8;
#pragma omp parallel for schedule(static) if (nrows * K >= 8 * PAR_MIN_WORK)
    for (int64_t i = 0; i < nrows; ++i) {
        const int64_t n = rows ? rows[i] : i;
        dequant_row(bits, qweight + n * row_bytes, scales + n * gpr, mins ? mins + n * gpr : NULL, K, shift,
                    out + i * K);
    }
    return 0;
}

int ls_w4_linear(const float *x, int64_t T, int64_t K, const uint8_t *qweight, const float *scales,
                 const float *mins, int64_t N, int64_t group, const float *bias, float *out, int64_t panel_min_rows) {
    return linear(4, x, T, K, qweight, scales, mins, N, group, bias, out,
                  panel_min_rows);
}

int ls_w8_linear(const float *x, int64_t T, int64_t K, const int8_t *qweight, const float *scales,
                 const float *mins, int64_t N, int64_t group, const float *bias, float *out, int64_t panel_min_rows) {
    return linear(8, x, T, K, (const uint8_t *)qweight, scales, mins, N, group, bias, out,
                  panel_min_rows);
}

int ls_w4_dequant(const uint8_t *qweight, const float *scales, const float *mins, int64_t K, int64_t group,
                  const int64_t *rows, int64_t nrows, float *out) {
    return dequant(4, qweight, scales, mins, K, group, rows, nrows, out);
}

int ls_w8_dequant(const int8_t *qweight, const float *scales, const float *mins, int64_t K, int64_t group,
                  const int64_t *rows, int64_t nrows, float *out) {
    return dequant(8, (const uint8_t *)qweight, scales, mins, K, group, rows, nrows, out);
}
