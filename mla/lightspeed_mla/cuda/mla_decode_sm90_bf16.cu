// The sm_90a MLA decode kernels for the bf16 cache, and for the FP8 cache with P V in bf16 (the CTA's shape,
// its producer and consumers: sm90_decode_common.cuh).
// bf16 cache: Q 72 KB + 2 x 72 KB stages + P 8 KB = 224 KB. Keys past the split's end in the last tile
//   are masked in S and their V rows zeroed (a page's tail past the request may hold NaN).
// FP8 cache (e4m3 latent, one fp32 scale a token, bf16 rope): Q's latent is quantised per row at the
//   start (scale amax / 448), S_latent runs as e4m3 wgmma (m64n32k32) and S_rope as bf16, S = q_scale *
//   k_scale * S_latent + S_rope. e4m3 wgmma takes K-major operands only and V is MN-major, so each
//   warpgroup widens its 256 V columns to bf16 in shared memory (exact: the e4m3 bits are placed in a
//   bf16 with the exponent bias left at 7, value * 2^-120) while its S MMAs run, and P V stays bf16
//   with the per-token scale (and the 2^120) folded into P. The stage is released as soon as S and the
//   widening are done. Q 40 KB + 2 x 41 KB stages + bf16 V 64 KB + P 8 KB = 194 KB.

#include "sm90_decode_tile.cuh"
#include "sm90_launch.h"

namespace lightspeed_mla {
namespace {

// Shared memory of the bf16 kernel (offsets from a 1024-aligned base).
namespace bf16l {
constexpr int kColBlocks = kDim / 64;                  // 9 blocks of 64 columns
constexpr int kTileBytes = kColBlocks * kBlockBytes;   // 72 KB: a Q tile or a KV tile
constexpr int kQ = 0;
constexpr int kKV = kQ + kTileBytes;
constexpr int kP = kKV + kStages * kTileBytes;
constexpr int kRedMax = kP + kRows * 128;  // float [2][64]
constexpr int kRedSum = kRedMax + 2 * kRows * 4;
constexpr int kBar = kRedSum + 2 * kRows * 4;  // uint64 full[2], empty[2]
constexpr int kSmemBytes = kBar + 2 * kStages * 8 + 1024;  // + slack to align the base to 1024 B
static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");
}  // namespace bf16l

// Shared memory of the FP8 kernel. kFp8Scores: Q's latent in e4m3 (S_latent on e4m3 MMAs), else Q in
// bf16 as the bf16 kernel has it (S_latent in bf16 on the widened latent).
template <bool kFp8Scores>
struct Fp8Layout {
  static constexpr int kQ = 0;                                      // e4m3 [64, 512] (4 blocks) | bf16 [64, 512]
  static constexpr int kQRope = (kFp8Scores ? 4 : 8) * kBlockBytes;  // bf16 [64, 64]: 1 block
  static constexpr int kStage0 = kQRope + kBlockBytes;
  static constexpr int kLatBytes = 4 * kBlockBytes, kRopeBytes = kBlockBytes;  // a stage: e4m3 latent, bf16 rope
  static constexpr int kStageBytes = kLatBytes + kRopeBytes;
  static constexpr int kTxBytes = kLatBytes + kRopeBytes + kKeys * 4;  // + the tile's fp32 scales
  static constexpr int kV = kStage0 + kStages * kStageBytes;  // bf16 widened latent [64 keys, 512]: 8 blocks
  static constexpr int kP = kV + 8 * kBlockBytes;
  static constexpr int kScales = kP + kRows * 128;  // float [2 stages][64]
  static constexpr int kRedMax = kScales + kStages * kKeys * 4;
  static constexpr int kRedSum = kRedMax + 2 * kRows * 4;
  static constexpr int kQScale = kRedSum + 2 * kRows * 4;  // float [64]
  static constexpr int kBar = kQScale + kRows * 4;
  static constexpr int kSmemBytes = kBar + 2 * kStages * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");
};

constexpr float kTwoPow120 = 1.329227995784916e36f;  // undoes the widened V's 2^-120 (in P)


// Widen 16 e4m3 latent values (key, col..col+15) of a stage to bf16 (value * 2^-120) in the V tile.
__device__ __forceinline__ void widen_chunk(const uint8_t* stage, uint8_t* v_tile, int key, int col) {
  const uint4 x = *reinterpret_cast<const uint4*>(stage + swizzled_offset_8bit(key, col));
  const uint2 a = e4m3x4_to_bf16x4_scaled(x.x), b = e4m3x4_to_bf16x4_scaled(x.y);
  const uint2 c = e4m3x4_to_bf16x4_scaled(x.z), d = e4m3x4_to_bf16x4_scaled(x.w);
  *reinterpret_cast<uint4*>(v_tile + swizzled_offset(key, col)) = make_uint4(a.x, a.y, b.x, b.y);
  *reinterpret_cast<uint4*>(v_tile + swizzled_offset(key, col + 8)) = make_uint4(c.x, c.y, d.x, d.y);
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_bf16_kernel(const __grid_constant__ CUtensorMap kv_map, const MlaSm90Args p) {
#ifdef LIGHTSPEED_SM90A
  using namespace bf16l;
  stamp(p, kPhaseEntry, threadIdx.x == 0);
  record(p, kCountClockEntry, threadIdx.x == 0);
  Work w;
  if (!cta_work(p, w)) return;  // the whole CTA, before any barrier
  stamp(p, kPhaseWork, threadIdx.x == 0);
  extern __shared__ uint8_t smem_raw[];
  uint32_t base;
  uint8_t* smem = aligned_smem(smem_raw, base);
  const uint32_t full_bar = base + kBar, empty_bar = init_barriers(full_bar);

  if (threadIdx.x >= kConsumerThreads) {  // ---- producer warpgroup ----
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == kConsumerThreads) {
      prefetch_tensormap(&kv_map);
      produce(p, w, full_bar, empty_bar, kTileBytes, [&](int stage, int j, int box_rows, int row, uint32_t bar) {
        const uint32_t dst = base + kKV + stage * kTileBytes + j * box_rows * 128;
#pragma unroll
        for (int c = 0; c < kColBlocks; ++c) tma_load_2d(dst + c * kBlockBytes, &kv_map, c * 64, row, bar);
      });
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kConsumerRegs>();
  const Frag f = make_frag(w);
  if (w.n_tiles > 0) {  // Q -> shared memory, swizzled; rows past the request's are zeros
    load_q_tile<kDim / 8>(p, w, f, smem + kQ, 0);
    fence_proxy_async();
  }
  named_barrier_sync(1, kConsumerThreads);
  stamp(p, kPhaseQLoaded, f.tid == 0);

  WaitCycles full_waits;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float no_mul[16] = {};
  for (int it = 0; it < w.n_tiles; ++it) {
    const int stage = it % kStages;
    const uint32_t kv_base = base + kKV + stage * kTileBytes;
    const int key0 = w.start + it * kKeys;
    full_waits.start();
    mbar_wait(full_bar + 8 * stage, (it / kStages) & 1);
    full_waits.stop();
    stamp(p, kPhaseFirstTile, f.tid == 0 && it == 0);

    // S[64 rows, this warpgroup's 32 keys] = Q K^T over the 576 columns: 36 k-steps of 16.
    float s[16];
    fence_regs(s);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDim / 16; ++k) {
      const uint32_t koff = (k >> 2) * kBlockBytes + (k & 3) * 32;
      wgmma_m64n32_ss(s, smem_desc(base + kQ + koff, 16), smem_desc(kv_base + f.wg * 32 * 128 + koff, 16), k > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(s);
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = key0 + frag_key(f, i) < f.limit[(i >> 1) & 1] ? s[i] * p.scale_log2 : -INFINITY;

    float mx[2];
    tile_row_max(s, reinterpret_cast<float*>(smem + kRedMax), f, mx);
    tile_probs<false>(s, no_mul, mx, m_run, l_run, acc, smem + kP, f);
    // Keys past `end` in this tile: zero this warpgroup's V rows (P is 0 there, but 0 * NaN is not).
    const int valid = w.end - key0;
    if (valid < kKeys) {
      for (int v = f.tid % 128; v < (kKeys - valid) * 4 * 8; v += 128) {
        const int r = valid + v / 32, blk = 4 * f.wg + (v / 8) % 4, c16 = v % 8;
        *reinterpret_cast<uint4*>(smem + kKV + stage * kTileBytes + blk * kBlockBytes + r * 128 + c16 * 16) =
            make_uint4(0, 0, 0, 0);
      }
    }
    fence_proxy_async();
    named_barrier_sync(1, kConsumerThreads);
    tile_pv(acc, base + kP, kv_base + 4 * f.wg * kBlockBytes);
    stamp(p, kPhaseLastPv, f.tid == 0 && it == w.n_tiles - 1);
    mbar_arrive(empty_bar + 8 * stage);
  }
  write_out(p, w, f, acc, m_run, l_run, reinterpret_cast<float*>(smem + kRedSum));
  stamp(p, kPhaseEpilogue, f.tid == 0);
  record(p, kCountClockEpilogue, f.tid == 0);
  record(p, kCountConsumerWaitFull, f.tid == 0, &full_waits);
#endif  // LIGHTSPEED_SM90A
}

template <bool kFp8Scores>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_fp8_kernel(const __grid_constant__ CUtensorMap lat_map, const __grid_constant__ CUtensorMap rope_map,
                               const MlaSm90Args p) {
#ifdef LIGHTSPEED_SM90A
  using L = Fp8Layout<kFp8Scores>;
  constexpr int kQ = L::kQ, kQRope = L::kQRope, kStage0 = L::kStage0, kLatBytes = L::kLatBytes;
  constexpr int kStageBytes = L::kStageBytes, kV = L::kV, kP = L::kP, kScales = L::kScales;
  constexpr int kRedMax = L::kRedMax, kRedSum = L::kRedSum, kQScale = L::kQScale, kBar = L::kBar;
  stamp(p, kPhaseEntry, threadIdx.x == 0);
  record(p, kCountClockEntry, threadIdx.x == 0);
  Work w;
  if (!cta_work(p, w)) return;
  stamp(p, kPhaseWork, threadIdx.x == 0);
  extern __shared__ uint8_t smem_raw[];
  uint32_t base;
  uint8_t* smem = aligned_smem(smem_raw, base);
  const uint32_t full_bar = base + kBar, empty_bar = init_barriers(full_bar);

  if (threadIdx.x >= kConsumerThreads) {  // ---- producer warpgroup ----
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == kConsumerThreads) {
      prefetch_tensormap(&lat_map);
      prefetch_tensormap(&rope_map);
      produce(p, w, full_bar, empty_bar, L::kTxBytes, [&](int stage, int j, int box_rows, int row, uint32_t bar) {
        load_fp8_box(&lat_map, &rope_map, p.scale, base + kStage0 + stage * kStageBytes,
                     base + kScales + stage * kKeys * 4, j, box_rows, row, bar);
      });
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kConsumerRegs>();
  const Frag f = make_frag(w);
  float* q_scale = reinterpret_cast<float*>(smem + kQScale);
  if (w.n_tiles > 0 && kFp8Scores) quantize_q_latent(p, w, f, smem + kQ, q_scale);
  if (w.n_tiles > 0 && !kFp8Scores) load_q_tile<64>(p, w, f, smem + kQ, 0);  // Q's latent in bf16, as bf16's
  if (w.n_tiles > 0) {
    load_q_tile<8>(p, w, f, smem + kQRope, 512);  // Q's rope stays bf16
    fence_proxy_async();
  }
  named_barrier_sync(1, kConsumerThreads);
  stamp(p, kPhaseQLoaded, f.tid == 0);

  WaitCycles full_waits;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  for (int it = 0; it < w.n_tiles; ++it) {
    const int stage = it % kStages;
    const uint32_t st_base = base + kStage0 + stage * kStageBytes;
    uint8_t* st = smem + kStage0 + stage * kStageBytes;
    const int key0 = w.start + it * kKeys;
    full_waits.start();
    mbar_wait(full_bar + 8 * stage, (it / kStages) & 1);
    full_waits.stop();
    stamp(p, kPhaseFirstTile, f.tid == 0 && it == 0);

    float s_lat0[16], s_lat1[16], s_rope[16];
    fence_regs(s_lat0);
    fence_regs(s_lat1);
    fence_regs(s_rope);
    if constexpr (kFp8Scores) {
      issue_s_e4m3(s_lat0, s_lat1, s_rope, base + kQ, base + kQRope, st_base, f.wg);
      // While those run: widen this warpgroup's 256 V columns (all 64 keys), read only by its own P V.
      for (int u = f.tid % 128; u < kKeys * 16; u += 128) {
        const int key = u / 16, col = 256 * f.wg + (u % 16) * 16;
        widen_chunk(st, smem + kV, key, col);
      }
    } else {
      // Widen this warpgroup's 32 keys (all 512 columns: its S reads them as K, both P Vs as V), once
      // both warpgroups are past the previous tile's P V.
      named_barrier_sync(1, kConsumerThreads);
      for (int u = f.tid % 128; u < 32 * 32; u += 128) {
        const int key = 32 * f.wg + u / 32, col = (u % 32) * 16;
        widen_chunk(st, smem + kV, key, col);
      }
      fence_proxy_async();
      named_barrier_sync(2 + f.wg, 128);  // this warpgroup's rows, for its S MMAs
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const uint32_t koff = (k >> 2) * kBlockBytes + (k & 3) * 32;
        wgmma_m64n32_ss(s_lat0, smem_desc(base + kQ + koff, 16), smem_desc(base + kV + f.wg * 32 * 128 + koff, 16), k > 0);
      }
#pragma unroll
      for (int k = 16; k < 32; ++k) {
        const uint32_t koff = (k >> 2) * kBlockBytes + (k & 3) * 32;
        wgmma_m64n32_ss(s_lat1, smem_desc(base + kQ + koff, 16), smem_desc(base + kV + f.wg * 32 * 128 + koff, 16), k > 16);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k)
        wgmma_m64n32_ss(s_rope, smem_desc(base + kQRope + k * 32, 16),
                        smem_desc(st_base + kLatBytes + f.wg * 32 * 128 + k * 32, 16), k > 0);
      wgmma_commit();
    }
    const float* k_scale = reinterpret_cast<const float*>(smem + kScales) + stage * kKeys;
    // S_latent scale: q_scale * k_scale for e4m3 Q, 2^120 * k_scale for the widened latent.
    const float q_mul[2] = {kFp8Scores ? q_scale[f.r_lo] : kTwoPow120, kFp8Scores ? q_scale[f.r_hi] : kTwoPow120};
    float s[16], p_mul[16];
    wgmma_wait_all();
    fence_regs(s_lat0);
    fence_regs(s_lat1);
    fence_regs(s_rope);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int h = (i >> 1) & 1, key = frag_key(f, i);
      const bool valid = key0 + key < f.limit[h];
      const float ks = k_scale[key];  // garbage past the request: selected away, never multiplied in
      s[i] = valid ? ((s_lat0[i] + s_lat1[i]) * (q_mul[h] * ks) + s_rope[i]) * p.scale_log2 : -INFINITY;
      p_mul[i] = valid ? ks * kTwoPow120 : 0.f;
    }
    mbar_arrive(empty_bar + 8 * stage);  // K, rope, scales and this thread's widening reads are done

    float mx[2];
    tile_row_max(s, reinterpret_cast<float*>(smem + kRedMax), f, mx);
    tile_probs<true>(s, p_mul, mx, m_run, l_run, acc, smem + kP, f);
    fence_proxy_async();  // P and the widened V, before wgmma reads them
    named_barrier_sync(1, kConsumerThreads);
    tile_pv(acc, base + kP, base + kV + 4 * f.wg * kBlockBytes);
    stamp(p, kPhaseLastPv, f.tid == 0 && it == w.n_tiles - 1);
  }
  write_out(p, w, f, acc, m_run, l_run, reinterpret_cast<float*>(smem + kRedSum));
  stamp(p, kPhaseEpilogue, f.tid == 0);
  record(p, kCountClockEpilogue, f.tid == 0);
  record(p, kCountConsumerWaitFull, f.tid == 0, &full_waits);
#endif  // LIGHTSPEED_SM90A
}

}  // namespace

namespace sm90_launch {

int bf16(const CUtensorMap& kv, const MlaSm90Args& a, dim3 grid, cudaStream_t stream, char* err, int errlen) {
  static unsigned long long opted = 0;
  if (const int rc = opt_in_smem(mla_decode_sm90_bf16_kernel, bf16l::kSmemBytes, opted, err, errlen)) return rc;
  if (a.batch == 0 || a.row_tiles == 0) return 0;
  mla_decode_sm90_bf16_kernel<<<grid, kThreads, bf16l::kSmemBytes, stream>>>(kv, a);
  return 0;
}

int fp8(const CUtensorMap& lat, const CUtensorMap& rope, const MlaSm90Args& a, dim3 grid, cudaStream_t stream,
        char* err, int errlen) {
  static unsigned long long opted_fp8 = 0, opted_fp8_scores = 0;
  if (a.fp8_scores) {
    constexpr int bytes = Fp8Layout<true>::kSmemBytes;
    if (const int rc = opt_in_smem(mla_decode_sm90_fp8_kernel<true>, bytes, opted_fp8_scores, err, errlen)) return rc;
    if (a.batch == 0 || a.row_tiles == 0) return 0;
    mla_decode_sm90_fp8_kernel<true><<<grid, kThreads, bytes, stream>>>(lat, rope, a);
  } else {
    constexpr int bytes = Fp8Layout<false>::kSmemBytes;
    if (const int rc = opt_in_smem(mla_decode_sm90_fp8_kernel<false>, bytes, opted_fp8, err, errlen)) return rc;
    if (a.batch == 0 || a.row_tiles == 0) return 0;
    mla_decode_sm90_fp8_kernel<false><<<grid, kThreads, bytes, stream>>>(lat, rope, a);
  }
  return 0;
}

int bf16_smem_bytes() { return bf16l::kSmemBytes; }
int fp8_smem_bytes(bool fp8_scores) {
  return fp8_scores ? Fp8Layout<true>::kSmemBytes : Fp8Layout<false>::kSmemBytes;
}

}  // namespace sm90_launch
}  // namespace lightspeed_mla
