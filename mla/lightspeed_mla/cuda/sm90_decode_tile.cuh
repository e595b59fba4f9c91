// The consumer warpgroups' per-tile pieces shared by the sm_90a MLA decode kernels: online softmax over a
// 64-key tile split between the two warpgroups, bf16 P V, the e4m3 S MMAs, and the write-out of the
// output or a split's partial.
#pragma once

#include "sm90_decode_common.cuh"

namespace lightspeed_mla {
namespace {

// Key of S fragment element i (0..15) within the 64-key tile.
__device__ __forceinline__ int frag_key(const Frag& f, int i) {
  return 32 * f.wg + 8 * (i >> 2) + 2 * (f.lane & 3) + (i & 1);
}

// Online softmax, part 1: each row's maximum over this tile's 64 keys (both warpgroups' halves).
// s: log2-domain scores, masked to -inf. Ends with the consumers' barrier.
__device__ __forceinline__ void tile_row_max(const float (&s)[16], float* red_max, const Frag& f, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int i = 0; i < 16; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  mx[0] = warp_max4(mx[0]);
  mx[1] = warp_max4(mx[1]);
  if ((f.lane & 3) == 0) {
    red_max[f.wg * kRows + f.r_lo] = mx[0];
    red_max[f.wg * kRows + f.r_hi] = mx[1];
  }
  named_barrier_sync(1, kConsumerThreads);
  mx[0] = fmaxf(red_max[f.r_lo], red_max[kRows + f.r_lo]);
  mx[1] = fmaxf(red_max[f.r_hi], red_max[kRows + f.r_hi]);
}

// Online softmax: the rows' new running max from this tile's mx, the max to subtract (0 for a row that has
// seen no key yet, so exp2 gives 0, not NaN) and alpha, the factor for what was accumulated before.
__device__ __forceinline__ void advance_row_max(const float (&mx)[2], float (&m_run)[2], float (&m_use)[2],
                                                float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(m_run[h], mx[h]);
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = exp2f(m_run[h] - m_use[h]);
    m_run[h] = m_new;
  }
}

// Online softmax, part 2: new running max, rescale the accumulator and the row sums, write
// P * p_mul (bf16) for this warpgroup's 32 keys into the swizzled [64, 64] P tile.
template <bool kScaleP>
__device__ __forceinline__ void tile_probs(const float (&s)[16], const float (&p_mul)[16], const float (&mx)[2],
                                           float (&m_run)[2], float (&l_run)[2], float (&acc)[128],
                                           uint8_t* p_tile, const Frag& f) {
  float m_use[2], alpha[2];
  advance_row_max(mx, m_run, m_use, alpha);
  float psum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    const int h = (i >> 1) & 1;
    float p0 = exp2f(s[i] - m_use[h]), p1 = exp2f(s[i + 1] - m_use[h]);
    psum[h] += p0 + p1;
    if (kScaleP) {
      p0 *= p_mul[i];
      p1 *= p_mul[i + 1];
    }
    *reinterpret_cast<__nv_bfloat162*>(p_tile + swizzled_offset(h ? f.r_hi : f.r_lo, frag_key(f, i))) =
        __floats2bfloat162_rn(p0, p1);
  }
  l_run[0] = l_run[0] * alpha[0] + psum[0];
  l_run[1] = l_run[1] * alpha[1] + psum[1];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] *= alpha[(i >> 1) & 1];
}

// O[64, 256 columns of this warpgroup] += P[64, 64] V[64 keys, 256]: 4 k-steps of 16 keys. v_base:
// this warpgroup's first [64 keys, 64 columns] bf16 block; the blocks are kBlockBytes apart.
__device__ __forceinline__ void tile_pv(float (&acc)[128], uint32_t p_base, uint32_t v_base) {
  fence_regs(acc);  // the rescaled accumulator is written before the fence
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kKeys / 16; ++k)
    wgmma_m64n256_ss_tb(acc, smem_desc(p_base + k * 32, 16), smem_desc(v_base + k * 16 * 128, kBlockBytes), 1);
  wgmma_commit();
  wgmma_wait_all();
  fence_regs(acc);
}

// Two adjacent output values: bf16 into the output, fp32 into a split's partial.
__device__ __forceinline__ void store2(__nv_bfloat16* dst, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}

// Row h of this thread's accumulator, times inv, into the row's 512 outputs at o: its n8 block j is columns
// col0 + 8j + {0, 1}.
template <typename T>
__device__ __forceinline__ void store_row(T* o, const float (&acc)[128], int h, float inv, const Frag& f) {
  const int col0 = 256 * f.wg + 2 * (f.lane & 3);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int i = 4 * j + 2 * h;
    store2(o + col0 + 8 * j, acc[i] * inv, acc[i + 1] * inv);
  }
}

// Each row's softmax sum over its quad and both warpgroups: red_sum[r] + red_sum[kRows + r] once the consumers'
// barrier this ends with is passed.
__device__ __forceinline__ void publish_row_sums(const Frag& f, float (&l_run)[2], float* red_sum) {
#pragma unroll
  for (int h = 0; h < 2; ++h) l_run[h] = warp_sum4(l_run[h]);
  if ((f.lane & 3) == 0) {
    red_sum[f.wg * kRows + f.r_lo] = l_run[0];
    red_sum[f.wg * kRows + f.r_hi] = l_run[1];
  }
  named_barrier_sync(1, kConsumerThreads);
}

// The output (one split) or this split's normalised partial and its log2-LSE.
__device__ __forceinline__ void write_out(const MlaSm90Args& p, const Work& w, const Frag& f, const float (&acc)[128],
                                          const float (&m_run)[2], float (&l_run)[2], float* red_sum) {
  publish_row_sums(f, l_run, red_sum);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? f.r_hi : f.r_lo;
    const int row = w.row0 + r;
    if (row >= w.rows_total) continue;
    const float l = red_sum[r] + red_sum[kRows + r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse2 = l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
    const int64_t tok = w.q_start + row / w.H, head = row % w.H;
    if (p.num_splits == 1) {
      store_row(static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_t + head * p.out_stride_h, acc, h, inv, f);
      if (p.lse != nullptr && f.wg == 0 && (f.lane & 3) == 0) p.lse[tok * w.H + head] = lse2 * 0.6931471805599453f;
    } else {
      store_row(p.partial_out + tok * p.po_stride_t + head * p.po_stride_h + w.split * p.po_stride_s, acc, h, inv, f);
      if (f.wg == 0 && (f.lane & 3) == 0) p.partial_lse[(tok * w.H + head) * p.num_splits + w.split] = lse2;
    }
  }
}

// S_latent of a tile on e4m3 MMAs in two fp32 halves of K (Hopper's e4m3 MMAs accumulate with reduced
// precision) and S_rope in bf16, this warpgroup's 32 keys: issued and committed as one group, not waited.
// Q's e4m3 latent at q_base, its bf16 rope at q_rope; the stage's latent at st_base, its rope after it.
__device__ __forceinline__ void issue_s_e4m3(float (&s_lat0)[16], float (&s_lat1)[16], float (&s_rope)[16],
                                             uint32_t q_base, uint32_t q_rope, uint32_t st_base, int wg) {
  constexpr int kLatBytes = 4 * kBlockBytes;  // a stage's e4m3 latent, then its bf16 rope (both FP8 layouts)
  fence_regs(s_lat0);
  fence_regs(s_lat1);
  fence_regs(s_rope);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t koff = (k >> 2) * kBlockBytes + (k & 3) * 32;
    wgmma_m64n32k32_e4m3(s_lat0, smem_desc(q_base + koff, 16), smem_desc(st_base + wg * 32 * 128 + koff, 16), k > 0);
  }
#pragma unroll
  for (int k = 8; k < 16; ++k) {
    const uint32_t koff = (k >> 2) * kBlockBytes + (k & 3) * 32;
    wgmma_m64n32k32_e4m3(s_lat1, smem_desc(q_base + koff, 16), smem_desc(st_base + wg * 32 * 128 + koff, 16), k > 8);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    wgmma_m64n32_ss(s_rope, smem_desc(q_rope + k * 32, 16), smem_desc(st_base + kLatBytes + wg * 32 * 128 + k * 32, 16),
                    k > 0);
  wgmma_commit();
}

}  // namespace
}  // namespace lightspeed_mla
