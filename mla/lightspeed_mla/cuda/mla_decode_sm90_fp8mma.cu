// The sm_90a MLA decode kernel for the FP8 cache with both products on e4m3 wgmma (the CTA's shape, its
// producer and consumers: sm90_decode_common.cuh).
// As the e4m3-scores kernel for S (Q quantised per row, S_latent in two fp32 halves of K, S_rope bf16).
// For P V, each consumer warpgroup transposes its half of the landed latent tile into V^T (transpose_latent)
// while its S MMAs run, the tile's P multiplier c (448 / its largest k_scale, rounded down to a power of two)
// comes out of the row-maximum exchange, and the consumers write P' = p * k_scale * c as e4m3 (in (224, 448] at
// most: e4m3's top binade) and run O[64, 256] += P'[64, 64] V^T on e4m3 wgmma (m64n256k32), the accumulator
// kept times the current tile's c (rescaled by c / c_prev with the softmax's alpha, divided out at the end).

#include "sm90_decode_tile.cuh"
#include "sm90_launch.h"

namespace lightspeed_mla {
namespace {

// Shared memory of the FP8-MMA kernel (both products on e4m3 wgmma): each consumer warpgroup transposes its
// 256 latent columns of a landed tile into V^T (e4m3 wgmma reads K-major operands only, and V's K is the key)
// and reads only those rows in its P V. Two V^T buffers: the consumers transpose tile i + 1 while P V of tile
// i runs (software pipelining, see the kernel). Two stages are enough: a stage is released after S and the
// transposition, long before its refill is needed (H100, 2026-12-06: with three the consumers waited for
// tiles 2% of their time; bench/results/mla_sm90_fp8mma_consumer_transpose_2026-12-06_0529_h100/).
namespace fp8mma {
constexpr int kRing = 2;                       // latent stages
constexpr int kVtBufs = 2;                     // V^T buffers
constexpr int kQ = 0;                          // e4m3 [64, 512]: 4 blocks, 128B-swizzled
constexpr int kQRope = 4 * kBlockBytes;        // bf16 [64, 64]: 1 block
constexpr int kStage0 = kQRope + kBlockBytes;  // a stage: e4m3 latent (4 blocks), bf16 rope (1 block)
constexpr int kLatBytes = 4 * kBlockBytes, kStageBytes = kLatBytes + kBlockBytes;
constexpr int kTxBytes = kStageBytes + kKeys * 4;  // + the tile's fp32 scales
constexpr int kVtBytes = 512 * kKeys;              // e4m3 V^T [512 N-rows, 64 key slots], 64B-swizzled
constexpr int kVt = kStage0 + kRing * kStageBytes;
constexpr int kPBufs = 2;                          // P tiles: tile i + 1's is written while P V of tile i reads
constexpr int kPBytes = kRows * kKeys;
constexpr int kP = kVt + kVtBufs * kVtBytes;       // e4m3 P [64 rows, 64 key slots], 64B-swizzled
constexpr int kScales = kP + kPBufs * kPBytes;     // float [kRing stages][64]
constexpr int kRedScale = kScales + kRing * kKeys * 4;  // float [8 consumer warps]: their largest k_scale
constexpr int kRedMax = kRedScale + 32;
constexpr int kRedSum = kRedMax + 2 * kRows * 4;
constexpr int kQScale = kRedSum + 2 * kRows * 4;   // float [64]
constexpr int kBar = kQScale + kRows * 4;          // uint64 full[kRing], empty[kRing]
constexpr int kSmemBytes = kBar + 2 * kRing * 8 + 1024;
// Registers: the producer warpgroup only issues loads from one lane; the consumers hold P V's accumulator
// (128) and S's (48) in flight while they transpose, which spilled at 232. setmaxnreg.inc only hands out
// what the CTA's other warps released of its launch share (168 x 384), so 32 / 240 hung the kernel.
constexpr int kLoaderRegs = 24, kMmaRegs = 240;
static_assert(128 * kLoaderRegs + kConsumerThreads * kMmaRegs <= kLaunchRegs * kThreads, "the CTA's registers");
static_assert(kVt % 1024 == 0 && kP % 1024 == 0 && kPBytes % 1024 == 0, "64B-swizzled tiles: 512-byte aligned bases");
static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");
}  // namespace fp8mma

// Consumer warpgroup `wg`'s 256 latent columns of a stage (e4m3 [64 keys, 512] in 128B-swizzled blocks of
// 128 columns, as TMA landed it) -> its 256 N-rows of V^T [512 N-rows, 64 key slots] (64B-swizzled,
// K-major), keys at or past `valid` zeroed (a page's tail past the request may hold NaN bytes, and 0 * NaN
// is NaN). A warp moves 16 keys x 32 columns a unit, 8 units a tile: ldmatrix loads four 8x8 matrices of
// byte pairs (keys 0-7 and 8-15 of the group, over two 16-column halves), byte permutes pair key k with key
// k + 8 in one 16-bit element, stmatrix.trans stores the elements transposed. So a V^T row holds the keys of
// each 16-key group in the order 0, 8, 1, 9, ..., 7, 15 (P is written in the same slot order: the product
// is unchanged), and the N-rows are the latent columns in vt_col order. Loads and stores are bank-conflict
// free.
__device__ __forceinline__ void transpose_latent(uint32_t lat, uint32_t vt, int valid, int wg, int warp, int lane) {
  // Recomputed per tile: hoisted out of the tile loop, the 16 addresses held registers the in-flight
  // accumulators need (ptxas spilled).
  asm volatile("" : "+r"(lane), "+r"(warp));
  const int m = lane / 8, r = lane % 8;
#pragma unroll 2  // two units in flight; more spills beside the in-flight accumulators (P V and S: 176 registers)
  for (int k = 0; k < 8; ++k) {
    const int u = 32 * wg + warp + 4 * k, j = u & 3, g32 = u >> 2;  // 16-key group, 32-column group
    uint32_t d[4];
    ldmatrix_x4(lat + swizzled_offset_8bit(16 * j + 8 * (m & 1) + r, 32 * g32 + 16 * (m >> 1)), d);
    const int key = 16 * j + lane / 4;  // the key of this thread's d[0] and d[2]; d[1] and d[3]: key + 8
    if (key >= valid) d[0] = d[2] = 0;
    if (key + 8 >= valid) d[1] = d[3] = 0;
    const uint32_t x[4] = {__byte_perm(d[0], d[1], 0x5140), __byte_perm(d[0], d[1], 0x7362),
                           __byte_perm(d[2], d[3], 0x5140), __byte_perm(d[2], d[3], 0x7362)};
    stmatrix_x4_trans(vt + swizzled_offset_64b(32 * g32 + 8 * m + r, 16 * j), x);
  }
}

// Part 1 of the tile's P multiplier c: this warp's largest |k_scale| over the keys its rows see (ks is 0
// past them) into red_scale[warp], read back by tile_multiplier after the consumers' next barrier.
__device__ __forceinline__ void warp_scale_max(const float (&ks)[16], float* red_scale, const Frag& f) {
  float mx = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) mx = fmaxf(mx, fabsf(ks[i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
  if (f.lane == 0) red_scale[f.tid / 32] = mx;
}

// Part 2: c = 448 (e4m3's largest finite value) / the tile's largest |k_scale| over the keys some row sees,
// rounded down to a power of two (1 when that is ~0). A power of two keeps P' <= 448 and makes c / c_prev exact
// and, tile after tile, mostly 1, so rescale_acc can skip the accumulator's rescale whenever no row's max moved
// either.
__device__ __forceinline__ float tile_multiplier(const float* red_scale) {
  float mx = 0.f;
#pragma unroll
  for (int w = 0; w < kConsumerThreads / 32; ++w) mx = fmaxf(mx, red_scale[w]);
  return mx > 1e-30f ? __int_as_float(__float_as_int(448.f / mx) & 0x7f800000) : 1.f;
}

// Online softmax, part 2 of the FP8-MMA kernel: as tile_probs, but P' = p * ks * c goes to the P tile as
// e4m3 in transpose_latent's key-slot order, and the accumulator (kept times c) is to be rescaled by
// rescale = alpha * c / c_prev once the last tile's P V is done (rescale_acc). Slots: this thread's keys 2q, 2q + 1, 8 + 2q, 9 + 2q of a 16-key group (q = lane % 4)
// are slots 4q, 4q + 2, 4q + 1, 4q + 3, so each row's four values of a group are one 32-bit store.
__device__ __forceinline__ void tile_probs_e4m3(const float (&s)[16], const float (&ks)[16], float c, float c_prev,
                                                const float (&mx)[2], float (&m_run)[2], float (&l_run)[2],
                                                float (&rescale)[2], uint8_t* p_tile, const Frag& f) {
  float m_use[2], alpha[2];
  advance_row_max(mx, m_run, m_use, alpha);
  float pv[16], psum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int h = (i >> 1) & 1;
    const float pr = exp2f(s[i] - m_use[h]);
    psum[h] += pr;
    pv[i] = pr * ks[i] * c;
  }
  const int q = f.lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int g = 0; g < 4; g += 2) {  // element i = 4g + 2h + e is key 32wg + 8g + 2q + e
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(pv[4 * g + 2 * h], pv[4 * g + 4 + 2 * h]),
                                                   __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(pv[4 * g + 2 * h + 1], pv[4 * g + 5 + 2 * h]),
                                                   __NV_SATFINITE, __NV_E4M3);
      *reinterpret_cast<uint32_t*>(p_tile + swizzled_offset_64b(h ? f.r_hi : f.r_lo, 32 * f.wg + 8 * g + 4 * q)) =
          lo | (hi << 16);
    }
  }
  l_run[0] = l_run[0] * alpha[0] + psum[0];
  l_run[1] = l_run[1] * alpha[1] + psum[1];
  const float ratio = c / c_prev;
  rescale[0] = alpha[0] * ratio;
  rescale[1] = alpha[1] * ratio;
}

// 128 multiplies a thread on the path between two tiles' MMAs; skipped (a warp-uniform branch) when every
// row of the warp keeps its max and c did not move, which is most tiles once a long context's max settles.
__device__ __forceinline__ void rescale_acc(float (&acc)[128], const float (&rescale)[2]) {
  if (__all_sync(0xffffffff, rescale[0] == 1.f && rescale[1] == 1.f)) return;
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] *= rescale[(i >> 1) & 1];
}

// O[64, this warpgroup's 256 N-rows] += P'[64, 64] V^T: 2 k-steps of 32 key slots, committed, not waited.
__device__ __forceinline__ void issue_pv_e4m3(float (&acc)[128], uint32_t p_base, uint32_t vt_base) {
  fence_regs(acc);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kKeys / 32; ++k)
    wgmma_m64n256k32_e4m3(acc, smem_desc_64b(p_base + k * 32), smem_desc_64b(vt_base + k * 32), 1);
  wgmma_commit();
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_fp8mma_kernel(const __grid_constant__ CUtensorMap lat_map,
                                  const __grid_constant__ CUtensorMap rope_map, const MlaSm90Args p) {
#ifdef LIGHTSPEED_SM90A
  using namespace fp8mma;
  stamp(p, kPhaseEntry, threadIdx.x == 0);
  record(p, kCountClockEntry, threadIdx.x == 0);
  Work w;
  if (!cta_work(p, w)) return;
  stamp(p, kPhaseWork, threadIdx.x == 0);
  extern __shared__ uint8_t smem_raw[];
  uint32_t base;
  uint8_t* smem = aligned_smem(smem_raw, base);
  // full: the stage landed (TMA bytes); empty: S and the transposition are done with it.
  const uint32_t full_bar = base + kBar, empty_bar = init_barriers<kRing>(full_bar);

  if (threadIdx.x >= kConsumerThreads) {  // ---- producer warpgroup: one lane issues the loads ----
    setmaxnreg_dec<kLoaderRegs>();
    if (threadIdx.x == kConsumerThreads) {
      prefetch_tensormap(&lat_map);
      prefetch_tensormap(&rope_map);
      produce<kRing>(p, w, full_bar, empty_bar, kTxBytes, [&](int stage, int j, int box_rows, int row, uint32_t bar) {
        load_fp8_box(&lat_map, &rope_map, p.scale, base + kStage0 + stage * kStageBytes,
                     base + kScales + stage * kKeys * 4, j, box_rows, row, bar);
      });
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kMmaRegs>();
  const Frag f = make_frag(w);
  float* q_scale = reinterpret_cast<float*>(smem + kQScale);
  float* red_scale = reinterpret_cast<float*>(smem + kRedScale);
  if (w.n_tiles > 0) {
    quantize_q_latent(p, w, f, smem + kQ, q_scale);
    load_q_tile<8>(p, w, f, smem + kQRope, 512);  // Q's rope stays bf16
    fence_proxy_async();
  }
  named_barrier_sync(1, kConsumerThreads);
  stamp(p, kPhaseQLoaded, f.tid == 0);

  WaitCycles full_waits, transposing;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, c_prev = 1.f;
  const float q_mul[2] = {q_scale[f.r_lo], q_scale[f.r_hi]};
  const int warp = (f.tid % 128) / 32;
  // Software pipelined, FlashAttention-3's intra-warpgroup overlap: a step issues S of tile i + 1, then P V of
  // tile i; transposes tile i + 1 (into the other V^T) while both run; waits for S only and runs tile i + 1's
  // softmax (into the other P tile) while P V still runs; then waits for P V and rescales the accumulator.
  // No MMA is in flight across the loop's back edge (ptxas serialises every wgmma of a kernel whose in-flight
  // accumulators it cannot keep in place: C7515).
  float s_lat0[16], s_lat1[16], s_rope[16];
  auto stage_base = [&](int it) { return base + kStage0 + (it % kRing) * kStageBytes; };
  auto issue_tile_s = [&](int it) {  // wait for tile it to land, issue its S
    full_waits.start();
    mbar_wait(full_bar + 8 * (it % kRing), (it / kRing) & 1);
    full_waits.stop();
    stamp(p, kPhaseFirstTile, f.tid == 0 && it == 0);
    issue_s_e4m3(s_lat0, s_lat1, s_rope, base + kQ, base + kQRope, stage_base(it), f.wg);
  };
  auto transpose_tile = [&](int it) {  // V^T buffer it % 2 was last read by P V of tile it - 2, waited for
    transposing.start();
    transpose_latent(stage_base(it), base + kVt + (it % kVtBufs) * kVtBytes, w.end - (w.start + it * kKeys), f.wg,
                     warp, f.lane);
    transposing.stop();
    stamp(p, kPhaseLastVt, f.tid == 0 && it == w.n_tiles - 1);
  };
  // Tile it's softmax from its S (waited for): its stage released, P' into P tile it % 2 (last read by P V of
  // tile it - 2, waited for), the running max and sums updated, the accumulator's factor into `rescale`.
  auto softmax_tile = [&](int it, float (&rescale)[2]) {
    const int stage = it % kRing;
    const int key0 = w.start + it * kKeys;
    const float* k_scale = reinterpret_cast<const float*>(smem + kScales) + stage * kKeys;
    fence_regs(s_lat0);
    fence_regs(s_lat1);
    fence_regs(s_rope);
    float s[16], ks[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int h = (i >> 1) & 1;
      const bool valid = key0 + frag_key(f, i) < f.limit[h];
      ks[i] = valid ? k_scale[frag_key(f, i)] : 0.f;  // garbage past the request: selected away
      s[i] = valid ? ((s_lat0[i] + s_lat1[i]) * (q_mul[h] * ks[i]) + s_rope[i]) * p.scale_log2 : -INFINITY;
    }
    mbar_arrive(empty_bar + 8 * stage);  // latent, rope and scales read (S and the transposition)
    float mx[2];
    warp_scale_max(ks, red_scale, f);
    tile_row_max(s, reinterpret_cast<float*>(smem + kRedMax), f, mx);
    const float c = tile_multiplier(red_scale);
    tile_probs_e4m3(s, ks, c, c_prev, mx, m_run, l_run, rescale, smem + kP + (it % kPBufs) * kPBytes, f);
    c_prev = c;
  };
  if (w.n_tiles > 0) {
    issue_tile_s(0);
    transpose_tile(0);
    wgmma_wait_all();
    float unused[2];  // the accumulator is still zero
    softmax_tile(0, unused);
    fence_proxy_async();  // P and V^T before wgmma reads them
    named_barrier_sync(1, kConsumerThreads);
  }
  auto issue_pv = [&](int it) {
    const uint32_t vt = base + kVt + (it % kVtBufs) * kVtBytes + 256 * f.wg * kKeys;  // this warpgroup's N-rows
    issue_pv_e4m3(acc, base + kP + (it % kPBufs) * kPBytes, vt);
  };
  for (int it = 0; it + 1 < w.n_tiles; ++it) {  // the last tile's P V after the loop: no branch around a wait
    issue_tile_s(it + 1);
    issue_pv(it);
    transpose_tile(it + 1);
    wgmma_wait<1>();  // S of tile it + 1 (committed first); P V of tile it may still run
    float rescale[2];
    softmax_tile(it + 1, rescale);
    wgmma_wait_all();
    fence_regs(acc);
    rescale_acc(acc, rescale);
    fence_proxy_async();  // P and V^T of tile it + 1 before wgmma reads them
    named_barrier_sync(1, kConsumerThreads);
  }
  if (w.n_tiles > 0) {
    issue_pv(w.n_tiles - 1);
    wgmma_wait_all();
  }
  fence_regs(acc);
  stamp(p, kPhaseLastPv, f.tid == 0 && w.n_tiles > 0);
  write_out<true>(p, w, f, acc, m_run, l_run, reinterpret_cast<float*>(smem + kRedSum), 1.f / c_prev);
  stamp(p, kPhaseEpilogue, f.tid == 0);
  record(p, kCountClockEpilogue, f.tid == 0);
  record(p, kCountConsumerWaitFull, f.tid == 0, &full_waits);
  record(p, kCountConsumerTranspose, f.tid == 0, &transposing);
#endif  // LIGHTSPEED_SM90A
}

}  // namespace

namespace sm90_launch {

int fp8mma(const CUtensorMap& lat, const CUtensorMap& rope, const MlaSm90Args& a, dim3 grid, cudaStream_t stream,
           char* err, int errlen) {
  static unsigned long long opted = 0;
  if (const int rc = opt_in_smem(mla_decode_sm90_fp8mma_kernel, fp8mma::kSmemBytes, opted, err, errlen)) return rc;
  if (a.batch == 0 || a.row_tiles == 0) return 0;
  mla_decode_sm90_fp8mma_kernel<<<grid, kThreads, fp8mma::kSmemBytes, stream>>>(lat, rope, a);
  return 0;
}

int fp8mma_smem_bytes() { return fp8mma::kSmemBytes; }

}  // namespace sm90_launch
}  // namespace lightspeed_mla
