/* Weight-only quantised GEMM with int8 activations: integer block dots (llama.cpp's Q8_K x Q4_K way).
 *
 * Why. With 2..64 token rows the fp32 path of quant_gemm.c is bound by its multiplies: four FMAs
 * per 32 weights per token row. Here each activation row is quantised once per call to int8 with
 * one fp32 scale per superblock of SB_BLOCKS blocks of 32 columns (dx = max|x| / 127, round to
 * nearest even), and the weight's per-group fp32 scales become, per superblock, one fp32 scale dw
 * times integer scales kw (|kw| <= KW_MAX: relative error below 1 / (2 KW_MAX) of the superblock's
 * largest scale). A 32-column block then costs one `maddubs` (u8 x s8 -> s16 pairs) and one
 * `madd` by its integer scale (-> s32), accumulated in int32 over the superblock; the conversion
 * and the FMA by dw * dx come once per superblock. With a per-block fp32 scale instead (Q8_0 x
 * Q4_1) a block costs maddubs, madd, convert, scale product and FMA: on a Zen 3 without VNNI that
 * measured slower than the fp32 path (bench/results/kernels_cpu_*q8*).
 *
 * Math, weight row n, token row t, superblock s, block b in s, half h (columns 16h..16h+15 of b):
 *     out[t, n] = sum_s dw[n, s] dx[t, s] sum_{b, h} kw[n, b, h] sum_{k in b, h} q[n, k] xq[t, k]
 *               + sum_g mins[n, g] xsum[t, g]           (xsum[t, g] = sum_{k in g} dx[t, s(k)] xq[t, k])
 *     kw[n, b, h] = nearbyint(scale[n, group of (b, h)] / dw[n, s]), dw = max_{b in s} |scale| / KW_MAX
 * The weight format is quant_gemm.c's: 4 bits unsigned 0..15 (GGUF nibble order), 8 bits signed.
 * Signed 8-bit codes go through the sign trick: maddubs(|w|, sign(xq, w)); |xq| <= 127, so
 * negating it is exact, and |w| = 128 reads correctly as an unsigned byte. Bounds: s16 pairs
 * <= 2 * 15 * 127 (4 bits), 2 * 128 * 127 (8 bits); the int32 sum over a superblock
 * <= SB_BLOCKS * 2 * pair * KW_MAX < 2^31 with KW_MAX 16383 (4 bits) and 4095 (8 bits).
 *
 * Dispatch. The AVX2 path is compiled with a target attribute (whatever -march is) and chosen at
 * run time when the CPU reports AVX2 and FMA; otherwise, or with `force_scalar`, the portable
 * loops run the same math (identical codes and scales; fp32 sums in another order).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define Q8_BLOCK 32
#define SB_BLOCKS 8               /* blocks of 32 columns per superblock (256 columns) */
#define Q8_TILE_T 4               /* token rows sharing one expansion of a weight block */
#define Q8_PAR_MIN_WORK (1 << 18) /* weights x rows below which one thread beats a fork/join */

static int q8_log2_exact(int64_t v) {
    int s = 0;
    while ((1LL << s) < v) ++s;
    return (1LL << s) == v ? s : -1;
}

/* ---- the per-call preparation (shared by both paths) ---------------------------------------- */

/* Activation rows: int8 codes and one scale per (row, superblock). */
static void quantize_rows(const float *x, int64_t T, int64_t K, int8_t *xq, float *dx) {
    const int64_t nb = K / Q8_BLOCK, nsb = (nb + SB_BLOCKS - 1) / SB_BLOCKS;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < nsb; ++s) {
            const int64_t k0 = s * SB_BLOCKS * Q8_BLOCK, k1 = k0 + SB_BLOCKS * Q8_BLOCK < K ? k0 + SB_BLOCKS * Q8_BLOCK : K;
            const float *xr = x + t * K;
            float amax = 0.0f;
            for (int64_t k = k0; k < k1; ++k) amax = fmaxf(amax, fabsf(xr[k]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            for (int64_t k = k0; k < k1; ++k) xq[t * K + k] = (int8_t)nearbyintf(xr[k] * id);
            dx[t * nsb + s] = d;
        }
}

/* Weight rows [n0, n1): the group scales as int16 (two per block: its column halves) times one
 * fp32 scale per superblock. */
static void integer_scales(const float *scales, int64_t n0, int64_t n1, int64_t K, int shift, int kw_max,
                           int16_t *kw, float *dw) {
    const int64_t nb = K / Q8_BLOCK, nsb = (nb + SB_BLOCKS - 1) / SB_BLOCKS, gpr = K >> shift;
    for (int64_t n = n0; n < n1; ++n) {
        const float *sc = scales + n * gpr;
        for (int64_t s = 0; s < nsb; ++s) {
            const int64_t b0 = s * SB_BLOCKS, b1 = b0 + SB_BLOCKS < nb ? b0 + SB_BLOCKS : nb;
            float amax = 0.0f;
            for (int64_t b = b0; b < b1; ++b)
                amax = fmaxf(amax, fmaxf(fabsf(sc[(b * 32) >> shift]), fabsf(sc[(b * 32 + 16) >> shift])));
            const float d = amax / (float)kw_max;
            for (int64_t b = b0; b < b1; ++b)
                for (int h = 0; h < 2; ++h)
                    kw[n * 2 * nb + 2 * b + h] = d != 0.0f ? (int16_t)nearbyintf(sc[(b * 32 + 16 * h) >> shift] / d) : 0;
            dw[n * nsb + s] = d;
        }
    }
}

/* ---- portable path ------------------------------------------------------------------------------ */

static inline int32_t code_q8(int bits, const uint8_t *row, int64_t k) {
    if (bits == 8) return ((const int8_t *)row)[k];
    const uint8_t byte = row[(k / 32) * 16 + (k % 16)];
    return (k % 32) < 16 ? (byte & 15) : (byte >> 4);
}

static float dot_q8_scalar(int bits, const uint8_t *row, const int16_t *kw, const float *dw, int64_t K,
                           const int8_t *xq, const float *dx) {
    const int64_t nb = K / Q8_BLOCK;
    float acc = 0.0f;
    for (int64_t b0 = 0; b0 < nb; b0 += SB_BLOCKS) {
        int32_t isum = 0;
        for (int64_t b = b0; b < nb && b < b0 + SB_BLOCKS; ++b) {
            int32_t half[2] = {0, 0};
            for (int j = 0; j < Q8_BLOCK; ++j) half[j >= 16] += code_q8(bits, row, b * 32 + j) * xq[b * 32 + j];
            isum += half[0] * kw[2 * b] + half[1] * kw[2 * b + 1];
        }
        acc += (float)isum * (dw[b0 / SB_BLOCKS] * dx[b0 / SB_BLOCKS]);
    }
    return acc;
}

/* ---- AVX2 path ---------------------------------------------------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define Q8_X86 1
#define TGT __attribute__((target("avx2,fma")))
#define TGT_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

TGT_INLINE float q8_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Block b of a weight row as 32 bytes in column order: 4 bits -> the nibbles (low ones are columns
 * 0-15, high ones 16-31); 8 bits -> the codes (the sign trick happens at the product). */
TGT_INLINE __m256i weight_bytes(const int bits, const uint8_t *row, int64_t b) {
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)(row + b * 32));
    const __m128i raw = _mm_loadu_si128((const __m128i *)(row + b * 16));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

/* nw (1 or 2) weight rows against nt (1..Q8_TILE_T) token rows; all constants at the call sites,
 * so the int32 accumulators stay in registers. out[i * Q8_TILE_T + t]. */
TGT_INLINE void tile_avx2(const int bits, const int nw, const int nt, const uint8_t *const rows[2],
                          const int16_t *const kw[2], const float *const dw[2], int64_t K, const int8_t *xq,
                          const float *dx, float *out) {
    const int64_t nb = K / Q8_BLOCK, nsb = (nb + SB_BLOCKS - 1) / SB_BLOCKS;
    __m256 acc[2][Q8_TILE_T];
    for (int i = 0; i < 2; ++i)
        for (int t = 0; t < Q8_TILE_T; ++t) acc[i][t] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; ++s) {
        __m256i isum[2][Q8_TILE_T];
        for (int i = 0; i < 2; ++i)
            for (int t = 0; t < Q8_TILE_T; ++t) isum[i][t] = _mm256_setzero_si256();
        const int64_t b1 = (s + 1) * SB_BLOCKS < nb ? (s + 1) * SB_BLOCKS : nb;
        for (int64_t b = s * SB_BLOCKS; b < b1; ++b) {
            __m256i w[2], k[2];
            for (int i = 0; i < nw; ++i) {
                w[i] = weight_bytes(bits, rows[i], b);
                k[i] = _mm256_set_m128i(_mm_set1_epi16(kw[i][2 * b + 1]), _mm_set1_epi16(kw[i][2 * b]));
            }
            for (int t = 0; t < nt; ++t) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + t * K + b * Q8_BLOCK));
                for (int i = 0; i < nw; ++i) {
                    const __m256i p = bits == 8 ? _mm256_maddubs_epi16(_mm256_abs_epi8(w[i]), _mm256_sign_epi8(x, w[i]))
                                                : _mm256_maddubs_epi16(w[i], x);
                    isum[i][t] = _mm256_add_epi32(isum[i][t], _mm256_madd_epi16(p, k[i]));
                }
            }
        }
        for (int t = 0; t < nt; ++t)
            for (int i = 0; i < nw; ++i)
                acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][t]), _mm256_set1_ps(dw[i][s] * dx[t * nsb + s]),
                                            acc[i][t]);
    }
    for (int i = 0; i < nw; ++i)
        for (int t = 0; t < nt; ++t) out[i * Q8_TILE_T + t] = q8_hsum8(acc[i][t]);
}

#define TILE_CASES(bits, nw)                                                                        \
    switch (nt) {                                                                                  \
        case 1: tile_avx2(bits, nw, 1, rows, kw, dw, K, xq, dx, out); break;                       \
        case 2: tile_avx2(bits, nw, 2, rows, kw, dw, K, xq, dx, out); break;                       \
        case 3: tile_avx2(bits, nw, 3, rows, kw, dw, K, xq, dx, out); break;                       \
        default: tile_avx2(bits, nw, 4, rows, kw, dw, K, xq, dx, out); break;                      \
    }

/* One tile, its shape picked among the compiled ones (a call per tile: the OpenMP loop stays in
 * code without the target attribute). */
TGT static void tile_dispatch_avx2(int bits, int nw, int nt, const uint8_t *const rows[2], const int16_t *const kw[2],
                                   const float *const dw[2], int64_t K, const int8_t *xq, const float *dx, float *out) {
    if (bits == 4) {
        if (nw == 2) { TILE_CASES(4, 2) } else { TILE_CASES(4, 1) }
    } else {
        if (nw == 2) { TILE_CASES(8, 2) } else { TILE_CASES(8, 1) }
    }
}
#else
#define Q8_X86 0
#endif

/* 1 when the AVX2 path runs on this CPU (the CPU's own report, not the build's target). */
int ls_q8_simd(void) {
#if Q8_X86
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
#else
    return 0;
#endif
}

/* ---- entry point -------------------------------------------------------------------------------- */

static float mins_dot(const float *mn, const float *xsum, int64_t gpr) {
    float s = 0.0f;
    for (int64_t g = 0; g < gpr; ++g) s += mn[g] * xsum[g];
    return s;
}

/* Tiles of weight rows [n0, n1) (pairs) by all T token rows. */
static void rows_q8(int bits, int simd, int64_t n0, int64_t n1, int64_t T, int64_t K, int64_t N, int64_t gpr,
                    const uint8_t *qweight, const int16_t *kw, const float *dw, const float *mins, const float *bias,
                    const int8_t *xq, const float *dx, const float *xsum, float *out) {
    const int64_t nb = K / Q8_BLOCK, nsb = (nb + SB_BLOCKS - 1) / SB_BLOCKS, row_bytes = K * bits / 8;
    for (int64_t n = n0; n < n1; n += 2) {
        const int nw = n + 1 < n1 ? 2 : 1;
        const uint8_t *rows[2] = {qweight + n * row_bytes, qweight + (n + nw - 1) * row_bytes};
        const int16_t *kws[2] = {kw + n * 2 * nb, kw + (n + nw - 1) * 2 * nb};
        const float *dws[2] = {dw + n * nsb, dw + (n + nw - 1) * nsb};
        for (int64_t t0 = 0; t0 < T; t0 += Q8_TILE_T) {
            const int nt = T - t0 < Q8_TILE_T ? (int)(T - t0) : Q8_TILE_T;
            float dots[2 * Q8_TILE_T];
#if Q8_X86
            if (simd)
                tile_dispatch_avx2(bits, nw, nt, rows, kws, dws, K, xq + t0 * K, dx + t0 * nsb, dots);
            else
#endif
                for (int i = 0; i < nw; ++i)
                    for (int t = 0; t < nt; ++t)
                        dots[i * Q8_TILE_T + t] = dot_q8_scalar(bits, rows[i], kws[i], dws[i], K, xq + (t0 + t) * K,
                                                                dx + (t0 + t) * nsb);
            for (int i = 0; i < nw; ++i)
                for (int t = 0; t < nt; ++t) {
                    const float m = mins ? mins_dot(mins + (n + i) * gpr, xsum + (t0 + t) * gpr, gpr) : 0.0f;
                    out[(t0 + t) * N + n + i] = dots[i * Q8_TILE_T + t] + m + (bias ? bias[n + i] : 0.0f);
                }
        }
    }
}

/* The integer form of a weight's scales (per weight, once: the launcher caches it): kw int16
 * [N, 2 K/32], dw fp32 [N, ceil(K/256)]. Returns 0, or 2 for a bad shape / group. */
int ls_q8_weight_scales(const float *scales, int64_t N, int64_t K, int64_t group, int64_t bits, int16_t *kw,
                        float *dw) {
    const int shift = q8_log2_exact(group);
    if (shift < 4 || K % Q8_BLOCK || K % group || (bits != 4 && bits != 8)) return 2;
    integer_scales(scales, 0, N, K, shift, bits == 8 ? 4095 : 16383, kw, dw);
    return 0;
}

/* out[T, N] = x[T, K] @ w^T (+ bias) with x in int8; kw, dw from ls_q8_weight_scales. Returns 0,
 * 2 for a bad shape / group, 1 if malloc fails. */
static int linear_q8(int bits, const float *x, int64_t T, int64_t K, const uint8_t *qweight, const int16_t *kw,
                     const float *dw, const float *mins, int64_t N, int64_t group, const float *bias, float *out,
                     int force_scalar) {
    const int shift = q8_log2_exact(group);
    if (shift < 4 || K % Q8_BLOCK || K % group) return 2;
    const int64_t gpr = K / group, nb = K / Q8_BLOCK, nsb = (nb + SB_BLOCKS - 1) / SB_BLOCKS;
    const int simd = !force_scalar && ls_q8_simd();
    int8_t *xq = (int8_t *)malloc((size_t)(T * K));
    float *dx = (float *)malloc(sizeof(float) * (size_t)(T * nsb));
    float *xsum = (float *)malloc(sizeof(float) * (size_t)(T * gpr));
    int rc = 1;
    if (xq && dx && xsum) {
        quantize_rows(x, T, K, xq, dx);
        /* The mins term sums the quantised activations, not x: then the activation rounding error
         * meets the weight (s q + m) centred, as in the codes term, instead of the uncentred s q
         * alone (measured on random Q4_1 rows: 1.7% against 0.7% relative error). */
        for (int64_t t = 0; t < T; ++t)
            for (int64_t g = 0; g < gpr; ++g) {
                float s = 0.0f;
                for (int64_t k = g * group; k < (g + 1) * group; ++k)
                    s += (float)xq[t * K + k] * dx[t * nsb + k / (SB_BLOCKS * Q8_BLOCK)];
                xsum[t * gpr + g] = s;
            }
        const int64_t chunk = 16; /* weight rows per OpenMP task */
#pragma omp parallel for schedule(static) if (N * K * T >= Q8_PAR_MIN_WORK)
        for (int64_t c = 0; c < (N + chunk - 1) / chunk; ++c) {
            const int64_t n0 = c * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
            rows_q8(bits, simd, n0, n1, T, K, N, gpr, qweight, kw, dw, mins, bias, xq, dx, xsum, out);
        }
        rc = 0;
    }
    free(xq), free(dx), free(xsum);
    return rc;
}

int ls_w4_linear_q8(const float *x, int64_t T, int64_t K, const uint8_t *qweight, const int16_t *kw, const float *dw,
                    const float *mins, int64_t N, int64_t group, const float *bias, float *out, int64_t force_scalar) {
    return linear_q8(4, x, T, K, qweight, kw, dw, mins, N, group, bias, out, (int)force_scalar);
}

int ls_w8_linear_q8(const float *x, int64_t T, int64_t K, const int8_t *qweight, const int16_t *kw, const float *dw,
                    const float *mins, int64_t N, int64_t group, const float *bias, float *out, int64_t force_scalar) {
    return linear_q8(8, x, T, K, (const uint8_t *)qweight, kw, dw, mins, N, group, bias, out, (int)force_scalar);
}
