/* The small per-token ops of a decoder layer on the CPU, fp32: RMSNorm (with the residual add),
 * SiLU-and-mul, rotary embedding, and the paged K/V store.
 *
 * Design note. At decode each of these touches a few kilobytes, so as chains of torch ops
 * (4-10 each) their cost is the per-op dispatch, not the arithmetic: about 50 ops per layer. One
 * call per op here does the same fp32 math in the reference's order; OpenMP splits the token
 * rows only when there are enough of them (prompts) to pay for waking threads.
 * Strides are in elements; the innermost dimension is contiguous.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#define PAR_MIN_ELEMENTS (1 << 15)

static void rms_row(const float *x, const float *w, int64_t H, float eps, float *out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < H; ++i) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)H + eps);
    for (int64_t i = 0; i < H; ++i) out[i] = (x[i] * r) * w[i];
}

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w */
int ls_rms_norm(const float *x, int64_t T, int64_t H, int64_t x_stride, const float *w, float eps, float *out,
                int64_t out_stride) {
#pragma omp parallel for schedule(static) if (T * H >= PAR_MIN_ELEMENTS)
    for (int64_t t = 0; t < T; ++t) rms_row(x + t * x_stride, w, H, eps, out + t * out_stride);
    return 0;
}

/* residual[t] = x[t] + residual[t]; out[t] = rms_norm(residual[t]) (x, residual, out contiguous [T, H]) */
int ls_fused_add_rms_norm(const float *x, float *residual, int64_t T, int64_t H, const float *w, float eps,
                          float *out) {
#pragma omp parallel for schedule(static) if (T * H >= PAR_MIN_ELEMENTS)
    for (int64_t t = 0; t < T; ++t) {
        float *r = residual + t * H;
        const float *xt = x + t * H;
        for (int64_t i = 0; i < H; ++i) r[i] = xt[i] + r[i];
        rms_row(r, w, H, eps, out + t * H);
    }
    return 0;
}

/* out[t, i] = silu(x[t, i]) * x[t, I + i], silu(g) = g / (1 + exp(-g)) */
int ls_silu_and_mul(const float *x, int64_t T, int64_t I, int64_t x_stride, float *out, int64_t out_stride) {
#pragma omp parallel for schedule(static) if (T * I >= PAR_MIN_ELEMENTS)
    for (int64_t t = 0; t < T; ++t) {
        const float *g = x + t * x_stride, *u = g + I;
        float *o = out + t * out_stride;
        int64_t i = 0;
#ifdef LS_AVX2
        const __m256 one = _mm256_set1_ps(1.0f);
        for (; i + 8 <= I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; ++i) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    return 0;
}

/* Rotate, in place, the first rot_dim features of each head of q [T, Hq, D] and k [T, Hkv, D]
 * (token strides q_stride / k_stride, heads D apart) at positions[t]. cache [max_pos, rot_dim] =
 * cos half | sin half. NeoX pairs feature i with i + rot_dim/2; GPT-J pairs 2i with 2i + 1. */
static void rotate_heads(float *x, int64_t heads, int64_t D, const float *cos, const float *sin, int64_t half,
                         int is_neox) {
    for (int64_t h = 0; h < heads; ++h) {
        float *v = x + h * D;
        for (int64_t i = 0; i < half; ++i) {
            const int64_t a = is_neox ? i : 2 * i, b = is_neox ? i + half : 2 * i + 1;
            const float x1 = v[a], x2 = v[b];
            v[a] = x1 * cos[i] - x2 * sin[i];
            v[b] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

int ls_rope(const int64_t *positions, int64_t T, float *q, int64_t num_q_heads, int64_t q_stride, float *k,
            int64_t num_kv_heads, int64_t k_stride, int64_t D, const float *cache, int64_t max_position,
            int64_t rot_dim, int is_neox) {
    const int64_t half = rot_dim / 2;
    for (int64_t t = 0; t < T; ++t)
        if (positions[t] < 0 || positions[t] >= max_position) return 2;
#pragma omp parallel for schedule(static) if (T * (num_q_heads + num_kv_heads) * D >= PAR_MIN_ELEMENTS)
    for (int64_t t = 0; t < T; ++t) {
        const float *cos = cache + positions[t] * rot_dim, *sin = cos + half;
        rotate_heads(q + t * q_stride, num_q_heads, D, cos, sin, half, is_neox);
        rotate_heads(k + t * k_stride, num_kv_heads, D, cos, sin, half, is_neox);
    }
    return 0;
}

/* k_cache[slot] = k[t], v_cache[slot] = v[t] for every t with slot_mapping[t] >= 0; a row is the
 * Hkv * D features of one token (contiguous in k / v with token strides, and in the caches). */
int ls_store_kv(const float *k, int64_t k_stride, const float *v, int64_t v_stride, int64_t T, int64_t row,
                float *k_cache, float *v_cache, const int64_t *slot_mapping, int64_t num_slots) {
    for (int64_t t = 0; t < T; ++t)
        if (slot_mapping[t] >= num_slots) return 2;
    for (int64_t t = 0; t < T; ++t) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        memcpy(k_cache + slot * row, k + t * k_stride, sizeof(float) * (size_t)row);
        memcpy(v_cache + slot * row, v + t * v_stride, sizeof(float) * (size_t)row);
    }
    return 0;
}
