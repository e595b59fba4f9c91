/* Paged decode attention on the CPU: one pass over each sequence's pages, no gathered copy.
 *
 * Design note. A decode step has 1..16 new query tokens per request (speculative verification),
 * each attending to every cached key up to its own position. The work item is one (request,
 * KV head): its G = Hq / Hkv query heads times q_len tokens share every K/V row, so each row is
 * read from the cache once, straight out of its page, and used by all of them. Softmax is the
 * online (running max / running sum) form, one page at a time, so nothing proportional to the
 * sequence length is allocated. Numerics: fp32 scores, exp and accumulation, like the torch
 * reference; only the summation order differs.
 *
 * Layouts (the attention/decode op contract): q [T, Hq, D] with strides q_token_stride and
 * q_head_stride (a view of the fused QKV projection), out [T, Hq, D] contiguous; k_cache, v_cache
 * [num_pages, page_size, Hkv, D] (fp32, or bf16 when cache_bf16); page_table int32 [B, pt_stride];
 * query_start_loc int32 [B + 1]; seq_lens int32 [B] (new tokens included). Scores are
 * q.k * scale * k_scale, then soft_cap * tanh(s / soft_cap) when soft_cap > 0; outputs are
 * multiplied by v_scale. Returns 0, or 1 if the work buffers cannot be allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "simd.h"

#define KEY_CHUNK 64 /* keys whose scores are held at once (a page may be longer) */

static inline float bf16_to_f32(uint16_t v) {
    union { uint32_t u; float f; } bits = {(uint32_t)v << 16};
    return bits.f;
}

static inline float dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
#ifdef LS_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    s = hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

/* Four dot products of q with k[0..3]: four independent FMA chains, then one 4-way reduction. */
static inline void dot4(const float *q, const float *const *k, int64_t n, float *out) {
    int64_t i = 0;
#ifdef LS_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[0] + i), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[1] + i), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[2] + i), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[3] + i), a3);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
#else
    for (int j = 0; j < 4; ++j) out[j] = 0.0f;
#endif
    for (; i < n; ++i)
        for (int j = 0; j < 4; ++j) out[j] += q[i] * k[j][i];
}

/* acc[d0 : d0 + 8 * STRIPS] = acc * keep + sum_j p[j] * v[j][...]: STRIPS independent accumulators
 * held in registers while the value rows stream past (one accumulator would chain the FMAs). */
#ifdef LS_AVX2
#define DEFINE_WEIGHTED_STRIPS(STRIPS)                                                                   \
    static inline void weighted_strips_##STRIPS(float *acc, float keep, const float *p,                  \
                                                const float *const *v, int64_t n, int64_t d0) {          \
        __m256 a[STRIPS];                                                                                \
        for (int i = 0; i < STRIPS; ++i)                                                                 \
            a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + d0 + 8 * i), _mm256_set1_ps(keep));               \
        for (int64_t j = 0; j < n; ++j) {                                                                \
            const __m256 pj = _mm256_set1_ps(p[j]);                                                      \
            const float *vj = v[j] + d0;                                                                 \
            for (int i = 0; i < STRIPS; ++i) a[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), a[i]); \
        }                                                                                                \
        for (int i = 0; i < STRIPS; ++i) _mm256_storeu_ps(acc + d0 + 8 * i, a[i]);                       \
    }
DEFINE_WEIGHTED_STRIPS(8)
DEFINE_WEIGHTED_STRIPS(4)
DEFINE_WEIGHTED_STRIPS(1)
#endif

/* acc[0:D] = acc * keep + sum_j p[j] * v[j][0:D] over n value rows. */
static inline void weighted_sum(float *acc, float keep, const float *p, const float *const *v, int64_t n, int64_t D) {
    int64_t d = 0;
#ifdef LS_AVX2
    for (; d + 64 <= D; d += 64) weighted_strips_8(acc, keep, p, v, n, d);
    for (; d + 32 <= D; d += 32) weighted_strips_4(acc, keep, p, v, n, d);
    for (; d + 8 <= D; d += 8) weighted_strips_1(acc, keep, p, v, n, d);
#endif
    for (; d < D; ++d) {
        float a = acc[d] * keep;
        for (int64_t j = 0; j < n; ++j) a += p[j] * v[j][d];
        acc[d] = a;
    }
}

/* exp(x - m) in place over n scores; returns their sum. */
static inline float exp_shifted(float *x, int64_t n, float m) {
    int64_t j = 0;
    float sum = 0.0f;
#ifdef LS_AVX2
    __m256 vsum = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), _mm256_set1_ps(m)));
        _mm256_storeu_ps(x + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    sum = hsum8(vsum);
#endif
    for (; j < n; ++j) sum += (x[j] = expf(x[j] - m));
    return sum;
}

typedef struct {
    const float *q;
    int64_t q_token_stride, q_head_stride; /* elements; features contiguous */
    const void *k_cache, *v_cache;
    int bf16;
    int64_t page_size, num_kv_heads, head_dim, pt_stride, num_q_heads;
    const int32_t *page_table, *query_start_loc, *seq_lens;
    float scale, soft_cap, v_scale;
    float *out;
} decode_args;

/* Per-thread scratch for one work item, sized for `rows` query rows. */
typedef struct {
    float *acc, *scores, *run_max, *run_sum, *rows_bf16; /* rows_bf16: 2 * KEY_CHUNK converted rows */
    const float **k_rows, **v_rows, **q_rows;
    int64_t *last;
} scratch;

static size_t scratch_bytes(int64_t rows, int64_t D) {
    return sizeof(float) * (size_t)(rows * (D + KEY_CHUNK + 2) + 2 * KEY_CHUNK * D) +
           sizeof(float *) * (size_t)(2 * KEY_CHUNK + rows) + sizeof(int64_t) * (size_t)rows;
}

static scratch carve(void *base, int64_t rows, int64_t D) {
    scratch w;
    float *f = (float *)base;
    w.acc = f, f += rows * D;
    w.scores = f, f += rows * KEY_CHUNK;
    w.run_max = f, f += rows;
    w.run_sum = f, f += rows;
    w.rows_bf16 = f, f += 2 * KEY_CHUNK * D;
    const float **p = (const float **)f;
    w.k_rows = p, p += KEY_CHUNK;
    w.v_rows = p, p += KEY_CHUNK;
    w.q_rows = p, p += rows;
    w.last = (int64_t *)p;
    return w;
}

/* Cache rows of keys [s0, s0 + n) of KV head h, as fp32 pointers (bf16 rows converted into `tmp`). */
static void gather_rows(const decode_args *a, const void *cache, const int32_t *pages, int64_t h, int64_t s0,
                        int64_t n, float *tmp, const float **rows) {
    const int64_t D = a->head_dim, row_elems = a->num_kv_heads * D;
    int64_t page_idx = s0 / a->page_size, offset = s0 % a->page_size;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t index = ((int64_t)pages[page_idx] * a->page_size + offset) * row_elems + h * D;
        if (a->bf16) {
            const uint16_t *src = (const uint16_t *)cache + index;
            for (int64_t d = 0; d < D; ++d) tmp[j * D + d] = bf16_to_f32(src[d]);
            rows[j] = tmp + j * D;
        } else {
            rows[j] = (const float *)cache + index;
        }
        if (++offset == a->page_size) offset = 0, ++page_idx;
    }
}

/* Attention of every query row of (request b, KV head h). */
static void attend(const decode_args *a, int64_t b, int64_t h, void *buffer) {
    const int64_t q_start = a->query_start_loc[b], q_len = a->query_start_loc[b + 1] - q_start;
    const int64_t seq_len = a->seq_lens[b], D = a->head_dim, group = a->num_q_heads / a->num_kv_heads;
    const int64_t rows = q_len * group; /* row r: query token r / group, head h * group + r % group */
    if (q_len <= 0 || seq_len <= 0) return;
    scratch w = carve(buffer, rows, D);
    for (int64_t r = 0; r < rows; ++r) {
        w.q_rows[r] = a->q + (q_start + r / group) * a->q_token_stride + (h * group + r % group) * a->q_head_stride;
        w.last[r] = seq_len - q_len + r / group; /* causal: the last key row r sees */
        w.run_max[r] = -INFINITY, w.run_sum[r] = 0.0f;
    }
    memset(w.acc, 0, sizeof(float) * (size_t)(rows * D));
    const int32_t *pages = a->page_table + b * a->pt_stride;
    for (int64_t s0 = 0; s0 < seq_len; s0 += KEY_CHUNK) {
        const int64_t n = seq_len - s0 < KEY_CHUNK ? seq_len - s0 : KEY_CHUNK;
        gather_rows(a, a->k_cache, pages, h, s0, n, w.rows_bf16, w.k_rows);
        gather_rows(a, a->v_cache, pages, h, s0, n, w.rows_bf16 + KEY_CHUNK * D, w.v_rows);
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t visible = w.last[r] - s0 + 1 < n ? w.last[r] - s0 + 1 : n;
            if (visible <= 0) continue;
            float *sr = w.scores + r * KEY_CHUNK, m = w.run_max[r];
            int64_t j = 0;
            for (; j + 4 <= visible; j += 4) dot4(w.q_rows[r], w.k_rows + j, D, sr + j);
            for (; j < visible; ++j) sr[j] = dot(w.q_rows[r], w.k_rows[j], D);
            for (j = 0; j < visible; ++j) {
                float x = sr[j] * a->scale;
                if (a->soft_cap > 0.0f) x = a->soft_cap * tanhf(x / a->soft_cap);
                sr[j] = x;
                m = x > m ? x : m;
            }
            const float keep = expf(w.run_max[r] - m); /* 0 on the first chunk: run_max is -inf */
            w.run_sum[r] = w.run_sum[r] * keep + exp_shifted(sr, visible, m);
            w.run_max[r] = m;
            weighted_sum(w.acc + r * D, keep, sr, w.v_rows, visible, D);
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        float *o = a->out + ((q_start + r / group) * a->num_q_heads + h * group + r % group) * D;
        const float norm = a->v_scale / w.run_sum[r];
        for (int64_t d = 0; d < D; ++d) o[d] = w.acc[r * D + d] * norm;
    }
}

int ls_paged_attention_decode(const float *q, int64_t q_token_stride, int64_t q_head_stride, const void *k_cache,
                              const void *v_cache, int cache_bf16,
                              int64_t page_size, int64_t num_kv_heads, int64_t head_dim, const int32_t *page_table,
                              int64_t pt_stride, const int32_t *query_start_loc, const int32_t *seq_lens,
                              int64_t batch, int64_t num_q_heads, float scale, float soft_cap, float k_scale,
                              float v_scale, float *out) {
    const decode_args a = {q, q_token_stride, q_head_stride, k_cache, v_cache, cache_bf16, page_size, num_kv_heads, head_dim, pt_stride,
                           num_q_heads, page_table, query_start_loc, seq_lens, scale * k_scale, soft_cap, v_scale,
                           out};
    int64_t max_rows = 0, keys = 0;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t rows = (query_start_loc[b + 1] - query_start_loc[b]) * (num_q_heads / num_kv_heads);
        max_rows = rows > max_rows ? rows : max_rows;
        keys += seq_lens[b];
    }
    const size_t bytes = (scratch_bytes(max_rows, head_dim) + 63) & ~(size_t)63;
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    char *work = (char *)malloc(bytes * (size_t)threads);
    if (!work) return 1;
#pragma omp parallel for schedule(dynamic, 1) collapse(2) if (keys * num_q_heads * head_dim >= (1 << 16))
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < num_kv_heads; ++h) {
#ifdef _OPENMP
            char *mine = work + bytes * (size_t)omp_get_thread_num();
#else
            char *mine = work;
#endif
            attend(&a, b, h, mine);
        }
    }
    free(work);
    return 0;
}
