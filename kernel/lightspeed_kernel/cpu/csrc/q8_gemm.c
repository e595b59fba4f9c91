/* Weight-only quantised GEMM with int8 activations (llama.cpp's Q8_0 x Q4 / Q8 integer dot).
 *
 * Why. With 2..64 token rows the fp32 path of quant_gemm.c is bound by its multiplies: four FMAs
 * per 32 weights per row, two FMA pipes. Here each activation row is quantised once per call to
 * int8 blocks of 32 (one fp32 scale per block: d = max|x| / 127, q = round-to-even(x / d)), and a
 * block product is one integer multiply-add pair (`maddubs`: u8 x s8 -> s16 pairs, `madd` with
 * ones -> s32 quads), one conversion and one FMA by the product of the two block scales.
 *
 * Math, for weight row n, token row t, block b of 32 columns (group = 1 << shift >= 16):
 *     out[t, n] = sum_b sum_{half h} sc[n, g(b, h)] * dx[t, b] * sum_{k in b, h} q[n, k] * xq[t, k]
 *               + sum_g mins[n, g] * xsum[t, g]                      (xsum: fp32 sums of x itself)
 * The weight format is quant_gemm.c's: 4 bits unsigned 0..15 (GGUF nibble order), 8 bits signed.
 * Signed 8-bit codes go through the sign trick: maddubs(|w|, sign(xq, w)); |xq| <= 127, so
 * negating it is exact, and |w| = 128 reads correctly as an unsigned byte. Neither case can
 * saturate the s16 pairs (15 * 127 * 2 and 128 * 127 * 2 are below 32767).
 *
 * Dispatch. The AVX2 path is compiled with a target attribute (whatever -march is) and chosen at
 * run time when the CPU reports AVX2 and FMA; otherwise, or with `force_scalar`, the portable
 * loops below run the same math (identical activation codes, fp32 accumulation in another order).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define Q8_BLOCK 32
#define Q8_TILE_T 4            /* token rows sharing one expansion of a weight block */
#define Q8_PAR_MIN_WORK (1 << 18) /* weights x rows below which one thread beats a fork/join */

static int q8_log2_exact(int64_t v) {
    int s = 0;
    while ((1LL << s) < v) ++s;
    return (1LL << s) == v ? s : -1;
}

/* ---- portable path: the definition ----------------------------------------------------------- */

static void quantize_rows_scalar(const float *x, int64_t T, int64_t K, int8_t *xq, float *dx) {
    const int64_t nb = K / Q8_BLOCK;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t b = 0; b < nb; ++b) {
            const float *xb = x + t * K + b * Q8_BLOCK;
            float amax = 0.0f;
            for (int j = 0; j < Q8_BLOCK; ++j) amax = fmaxf(amax, fabsf(xb[j]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            for (int j = 0; j < Q8_BLOCK; ++j) xq[t * K + b * Q8_BLOCK + j] = (int8_t)nearbyintf(xb[j] * id);
            dx[t * nb + b] = d;
        }
}

static inline int32_t code_q8(int bits, const uint8_t *row, int64_t k) {
    if (bits == 8) return ((const int8_t *)row)[k];
    const uint8_t byte = row[(k / 32) * 16 + (k % 16)];
    return (k % 32) < 16 ? (byte & 15) : (byte >> 4);
}

static float dot_q8_scalar(int bits, const uint8_t *row, const float *sc, int64_t K, int shift,
                           const int8_t *xq, const float *dx) {
    float acc = 0.0f;
    for (int64_t b = 0; b < K / Q8_BLOCK; ++b) {
        int32_t half[2] = {0, 0};
        for (int j = 0; j < Q8_BLOCK; ++j) {
            const int64_t k = b * Q8_BLOCK + j;
            half[j >= 16] += code_q8(bits, row, k) * xq[k];
        }
        const float s_lo = sc[(b * 32) >> shift] * dx[b], s_hi = sc[(b * 32 + 16) >> shift] * dx[b];
        acc += (float)half[0] * s_lo + (float)half[1] * s_hi;
    }
    return acc;
}

/* ---- AVX2 path --------------------------------------------------------------------------------- */

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

/* The same codes and scales as quantize_rows_scalar (same fp32 operations, round to nearest even). */
TGT static void quantize_rows_avx2(const float *x, int64_t T, int64_t K, int8_t *xq, float *dx) {
    const int64_t nb = K / Q8_BLOCK;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo the packs' lane interleave */
    for (int64_t t = 0; t < T; ++t)
        for (int64_t b = 0; b < nb; ++b) {
            const float *xb = x + t * K + b * Q8_BLOCK;
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; ++i) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float d = _mm_cvtss_f32(m4) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            __m256i q[4];
            for (int i = 0; i < 4; ++i)
                q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(id)),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(xq + t * K + b * Q8_BLOCK), _mm256_permutevar8x32_epi32(packed, order));
            dx[t * nb + b] = d;
        }
}

/* Block b of a weight row as 32 bytes in column order: 4 bits -> the nibbles (low ones are columns
 * 0-15, high ones 16-31); 8 bits -> |w| (the sign goes onto the activations). */
TGT_INLINE __m256i weight_bytes(const int bits, const uint8_t *row, int64_t b) {
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)(row + b * 32));
    const __m128i raw = _mm_loadu_si128((const __m128i *)(row + b * 16));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

/* nw (1 or 2) weight rows against nt (1..Q8_TILE_T) token rows; all constants at the call sites,
 * so the nw * nt accumulators stay in registers. g16: the two halves of a block have their own
 * weight scales (group 16). out[i * Q8_TILE_T + t]. */
TGT_INLINE void tile_avx2(const int bits, const int nw, const int nt, const int g16, const uint8_t *const rows[2],
                          const float *const sc[2], int64_t K, int shift, const int8_t *xq, const float *dx,
                          float *out) {
    const int64_t nb = K / Q8_BLOCK;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][Q8_TILE_T];
    for (int i = 0; i < 2; ++i)
        for (int t = 0; t < Q8_TILE_T; ++t) acc[i][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        __m256i w[2];
        __m256 s_w[2];
        for (int i = 0; i < nw; ++i) {
            w[i] = weight_bytes(bits, rows[i], b);
            if (g16)
                s_w[i] = _mm256_set_m128(_mm_set1_ps(sc[i][2 * b + 1]), _mm_set1_ps(sc[i][2 * b]));
            else
                s_w[i] = _mm256_set1_ps(sc[i][(b * 32) >> shift]);
        }
        for (int t = 0; t < nt; ++t) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + t * K + b * Q8_BLOCK));
            const __m256 d = _mm256_set1_ps(dx[t * nb + b]);
            for (int i = 0; i < nw; ++i) {
                const __m256i p = bits == 8 ? _mm256_maddubs_epi16(_mm256_abs_epi8(w[i]), _mm256_sign_epi8(x, w[i]))
                                            : _mm256_maddubs_epi16(w[i], x);
                const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                acc[i][t] = _mm256_fmadd_ps(f, _mm256_mul_ps(s_w[i], d), acc[i][t]);
            }
        }
    }
    for (int i = 0; i < nw; ++i)
        for (int t = 0; t < nt; ++t) out[i * Q8_TILE_T + t] = q8_hsum8(acc[i][t]);
}

#define TILE_CASES(bits, nw, g16)                                                                   \
    switch (nt) {                                                                                  \
        case 1: tile_avx2(bits, nw, 1, g16, rows, sc, K, shift, xq, dx, out); break;               \
        case 2: tile_avx2(bits, nw, 2, g16, rows, sc, K, shift, xq, dx, out); break;               \
        case 3: tile_avx2(bits, nw, 3, g16, rows, sc, K, shift, xq, dx, out); break;               \
        default: tile_avx2(bits, nw, 4, g16, rows, sc, K, shift, xq, dx, out); break;              \
    }

/* One tile, its shape picked among the compiled ones (a function call per tile: the OpenMP loop
 * stays in code without the target attribute). */
TGT static void tile_dispatch_avx2(int bits, int nw, int nt, const uint8_t *const rows[2], const float *const sc[2],
                                   int64_t K, int shift, const int8_t *xq, const float *dx, float *out) {
    const int g16 = shift == 4;
    if (bits == 4) {
        if (g16) { if (nw == 2) { TILE_CASES(4, 2, 1) } else { TILE_CASES(4, 1, 1) } }
        else { if (nw == 2) { TILE_CASES(4, 2, 0) } else { TILE_CASES(4, 1, 0) } }
    } else {
        if (g16) { if (nw == 2) { TILE_CASES(8, 2, 1) } else { TILE_CASES(8, 1, 1) } }
        else { if (nw == 2) { TILE_CASES(8, 2, 0) } else { TILE_CASES(8, 1, 0) } }
    }
}
#else
#define Q8_X86 0
#endif

/* 1 when the AVX2 path runs on this CPU (checked once by the CPU's own report, not the build's). */
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

/* out[T, N] = x[T, K] @ w^T (+ bias) with x quantised to int8 blocks. Returns 0, 2 for a bad
 * shape / group, 1 if malloc fails. */
static int linear_q8(int bits, const float *x, int64_t T, int64_t K, const uint8_t *qweight, const float *scales,
                     const float *mins, int64_t N, int64_t group, const float *bias, float *out, int force_scalar) {
    const int shift = q8_log2_exact(group);
    if (shift < 4 || K % Q8_BLOCK || K % group) return 2;
    const int64_t gpr = K / group, nb = K / Q8_BLOCK, row_bytes = K * bits / 8;
    const int simd = !force_scalar && ls_q8_simd();
    int8_t *xq = (int8_t *)malloc((size_t)(T * K));
    float *dx = (float *)malloc(sizeof(float) * (size_t)(T * nb));
    float *xsum = (float *)malloc(sizeof(float) * (size_t)(T * gpr));
    if (!xq || !dx || !xsum) {
        free(xq), free(dx), free(xsum);
        return 1;
    }
#if Q8_X86
    if (simd)
        quantize_rows_avx2(x, T, K, xq, dx);
    else
#endif
        quantize_rows_scalar(x, T, K, xq, dx);
    for (int64_t t = 0; t < T; ++t) /* the mins term uses x itself: exact up to fp32 sums */
        for (int64_t g = 0; g < gpr; ++g) {
            float s = 0.0f;
            for (int64_t j = 0; j < group; ++j) s += x[t * K + g * group + j];
            xsum[t * gpr + g] = s;
        }
#pragma omp parallel for schedule(static) if (N * K * T >= Q8_PAR_MIN_WORK)
    for (int64_t pair = 0; pair < (N + 1) / 2; ++pair) {
        const int64_t n = 2 * pair;
        const int nw = n + 1 < N ? 2 : 1;
        const uint8_t *rows[2] = {qweight + n * row_bytes, qweight + (n + nw - 1) * row_bytes};
        const float *sc[2] = {scales + n * gpr, scales + (n + nw - 1) * gpr};
        for (int64_t t0 = 0; t0 < T; t0 += Q8_TILE_T) {
            const int nt = T - t0 < Q8_TILE_T ? (int)(T - t0) : Q8_TILE_T;
            float dots[2 * Q8_TILE_T];
            for (int i = 0; i < nw; ++i)
                for (int t = 0; t < nt; ++t)
                    dots[i * Q8_TILE_T + t] = simd ? 0.0f : dot_q8_scalar(bits, rows[i], sc[i], K, shift,
                                                                           xq + (t0 + t) * K, dx + (t0 + t) * nb);
#if Q8_X86
            if (simd) tile_dispatch_avx2(bits, nw, nt, rows, sc, K, shift, xq + t0 * K, dx + t0 * nb, dots);
#endif
            for (int i = 0; i < nw; ++i)
                for (int t = 0; t < nt; ++t) {
                    const float m = mins ? mins_dot(mins + (n + i) * gpr, xsum + (t0 + t) * gpr, gpr) : 0.0f;
                    out[(t0 + t) * N + n + i] = dots[i * Q8_TILE_T + t] + m + (bias ? bias[n + i] : 0.0f);
                }
        }
    }
    free(xq), free(dx), free(xsum);
    return 0;
}

int ls_w4_linear_q8(const float *x, int64_t T, int64_t K, const uint8_t *qweight, const float *scales,
                    const float *mins, int64_t N, int64_t group, const float *bias, float *out, int64_t force_scalar) {
    return linear_q8(4, x, T, K, qweight, scales, mins, N, group, bias, out, (int)force_scalar);
}

int ls_w8_linear_q8(const float *x, int64_t T, int64_t K, const int8_t *qweight, const float *scales,
                    const float *mins, int64_t N, int64_t group, const float *bias, float *out, int64_t force_scalar) {
    return linear_q8(8, x, T, K, (const uint8_t *)qweight, scales, mins, N, group, bias, out, (int)force_scalar);
}
