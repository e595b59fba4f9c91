// Absorbed MLA decode for sm_90a: TMA page loads into a shared-memory ring, one producer lane, two
// consumer warpgroups running wgmma, online softmax, split-KV partials for the Triton combine.
//
// Design note. A CTA owns 64 rows of one request (rows = (query token, head) pairs, row =
// token * H + head, so 16 heads x 4 speculative tokens fill one tile) and one split of its keys.
//   warpgroup 2 (producer; one lane): for each 64-key tile, reads the page ids from the page table and
//     issues TMA boxes of [min(page_size, 64) tokens, 128 bytes] per page piece: 9 of them cover a bf16
//     token's 576 values, each landing 128B-swizzled, the layout wgmma reads. A 2-stage ring with full /
//     empty mbarriers.
//   warpgroups 0 and 1 (consumers): warpgroup g computes S = Q K^T for keys 32g..32g+31 of the tile
//     (m64n32, K = 576: Q and K both from shared memory), the two exchange row maxima through shared
//     memory, each writes its half of P (bf16) to shared memory, and then warpgroup g runs P V for
//     latent columns 256g..256g+255 (m64n256k16, V = the latent tile read MN-major). So every MMA is
//     done once, S and P V are split evenly, and the 64x512 fp32 accumulator is 128 registers a thread.
// bf16 cache: Q 72 KB + 2 x 72 KB stages + P 8 KB = 224 KB. Keys past the split's end in the last tile
//   are masked in S and their V rows zeroed (a page's tail past the request may hold NaN).
// FP8 cache (e4m3 latent, one fp32 scale a token, bf16 rope): Q's latent is quantised per row at the
//   start (scale amax / 448), S_latent runs as e4m3 wgmma (m64n32k32) and S_rope as bf16, S = q_scale *
//   k_scale * S_latent + S_rope. e4m3 wgmma takes K-major operands only and V is MN-major, so each
//   warpgroup widens its 256 V columns to bf16 in shared memory (exact: the e4m3 bits are placed in a
//   bf16 with the exponent bias left at 7, value * 2^-120) while its S MMAs run, and P V stays bf16
//   with the per-token scale (and the 2^120) folded into P. The stage is released as soon as S and the
//   widening are done. Q 40 KB + 2 x 41 KB stages + bf16 V 64 KB + P 8 KB = 194 KB.
// Page sizes 8..256 (powers of two): a tile is one page piece of min(page_size, 64) tokens or several.
// Phase timers: built with -DLIGHTSPEED_MLA_PHASE_TIMERS, each CTA stamps %globaltimer at the boundaries
// of mla_decode_sm90.h's MlaPhase into MlaSm90Args::phase_ns (tools/bench/mla_phases.py reads them);
// without the define stamp() is empty and the kernels compile to the production code exactly.

#include "mla_decode_sm90.h"

#include <cudaTypedefs.h>

#include <cmath>
#include <cstdio>

#include "sm90_ptx.cuh"

namespace lightspeed_mla {
namespace {

using namespace sm90;

constexpr int kRows = 64;   // query rows per CTA (one wgmma M)
constexpr int kKeys = 64;   // keys per tile
constexpr int kStages = 2;
constexpr int kDim = 576;   // latent 512 + rope 64
constexpr int kBlockBytes = kKeys * 128;  // one swizzled [64 rows, 128 bytes] block: 8 KB
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup (one lane issues)
// Registers are handed out per warpgroup: 384 threads get 168 each at launch; the producer gives
// most of its share back so the consumers' 128-register accumulators fit.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
// What each thread holds at launch (65536 / 384, rounded down to 8): setmaxnreg.inc can only take registers
// that other warps of the CTA gave back, so the warpgroups' shares must sum to at most this.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;  // 168
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kLaunchRegs * kThreads, "the CTA's registers");

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

constexpr float kTwoPow120 = 1.329227995784916e36f;  // undoes the widened V's 2^-120 (in P)

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LIGHTSPEED_SM90A 1
#endif

// What one CTA does: request b's rows row0.. (a 64-row tile) over keys [start, end) of split `split`.
struct Work {
  int split, b, H, q_start, q_len, kv_len, row0, rows_total, start, end, n_tiles;
};

#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns)::"memory");  // "memory": stays where it is written
  return ns;
}
#endif

#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
__device__ __forceinline__ uint64_t clock_cycles() {
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
}

__device__ __forceinline__ int64_t timer_row() {
  const int64_t cta = (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  return cta * kTimerSlots;
}
#endif

// The calling thread stamps `phase` for its CTA when `who` holds (one thread a role, see MlaPhase).
__device__ __forceinline__ void stamp(const MlaSm90Args& p, MlaPhase phase, bool who) {
#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
  if (!who || p.phase_ns == nullptr) return;
  p.phase_ns[timer_row() + phase] = globaltimer_ns();
#endif
}

// A role's wait cycles (MlaCounter): every thread of the role brackets its waits with start() / stop(),
// one records the sum at its end. Empty outside the timer build.
struct WaitCycles {
#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
  uint64_t sum = 0, t0 = 0;
  __device__ __forceinline__ void start() { t0 = clock_cycles(); }
  __device__ __forceinline__ void stop() { sum += clock_cycles() - t0; }
#else
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void stop() {}
#endif
};

// The timer build's counter `c` for this CTA: a WaitCycles sum, or (no sum given) %clock64 now.
__device__ __forceinline__ void record(const MlaSm90Args& p, MlaCounter c, bool who, const WaitCycles* waits = nullptr) {
#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
  if (!who || p.phase_ns == nullptr) return;
  p.phase_ns[timer_row() + kNumPhases + c] = waits != nullptr ? waits->sum : clock_cycles();
#endif
}

__device__ __forceinline__ bool cta_work(const MlaSm90Args& p, Work& w) {
  w.split = blockIdx.x;
  w.b = blockIdx.z;
  w.H = p.num_heads;
  w.q_start = p.query_start[w.b];
  w.q_len = p.query_start[w.b + 1] - w.q_start;
  w.kv_len = p.seq_lens[w.b];
  w.row0 = blockIdx.y * kRows;
  w.rows_total = w.q_len * w.H;
  if (w.row0 >= w.rows_total) return false;
  // Split `split` of the request's keys (64-aligned ranges, as the Triton kernel cuts them), cut at
  // the causal end of the tile's last row.
  const int last_q = min((w.row0 + kRows - 1) / w.H, w.q_len - 1);
  const int tile_end = w.kv_len - w.q_len + last_q + 1;
  const int per_split = ((w.kv_len + p.num_splits - 1) / p.num_splits + kKeys - 1) / kKeys * kKeys;
  w.start = w.split * per_split;
  w.end = min(w.start + per_split, tile_end);
  w.n_tiles = w.end > w.start ? (w.end - w.start + kKeys - 1) / kKeys : 0;
  return true;
}

// A consumer thread's place in the wgmma fragments: rows r_lo and r_hi of the 64, and the causal
// key limit of each (query i of the request sees keys < kv_len - q_len + i + 1).
struct Frag {
  int tid, wg, lane, r_lo, r_hi, limit[2];
};

__device__ __forceinline__ Frag make_frag(const Work& w) {
  Frag f;
  f.tid = threadIdx.x;
  f.wg = f.tid / 128;
  f.lane = f.tid % 32;
  f.r_lo = 16 * ((f.tid % 128) / 32) + f.lane / 4;
  f.r_hi = f.r_lo + 8;
#pragma unroll
  for (int h = 0; h < 2; ++h) f.limit[h] = min(w.end, w.kv_len - w.q_len + (w.row0 + (h ? f.r_hi : f.r_lo)) / w.H + 1);
  return f;
}

// Columns [col0, col0 + 8 * kChunks) of the CTA's 64 query rows -> a bf16 tile in shared memory at dst,
// 128B-swizzled (rows past the request's are zeros). Every load is issued before the first store: in a
// load-then-store loop each load waits for the one before (the compiler cannot tell the global and
// shared pointers apart), and at 18 chunks a thread that chain was a large share of a short split's
// time; batched, the tile costs about one memory latency.
template <int kChunks>  // 16-byte chunks a row
__device__ __forceinline__ void load_q_tile(const MlaSm90Args& p, const Work& w, const Frag& f, uint8_t* dst, int col0) {
  static_assert(kRows * kChunks % kConsumerThreads == 0, "every consumer thread loads the same count");
  constexpr int kPer = kRows * kChunks / kConsumerThreads;
  uint4 val[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int v = f.tid + i * kConsumerThreads, r = v / kChunks, c8 = v % kChunks, row = w.row0 + r;
    val[i] = make_uint4(0, 0, 0, 0);
    if (row < w.rows_total) {
      const int64_t tok = w.q_start + row / w.H, head = row % w.H;
      val[i] = __ldg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.q) + tok * p.q_stride_t +
                                                    head * p.q_stride_h + col0 + c8 * 8));
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int v = f.tid + i * kConsumerThreads;
    *reinterpret_cast<uint4*>(dst + swizzled_offset(v / kChunks, (v % kChunks) * 8)) = val[i];
  }
}

// Q's latent -> e4m3 in shared memory (128B-swizzled [64, 512]) with one scale a row (amax / 448) into
// q_scale[64]: four threads a row, 128 columns each. Rows past the request's are zeros. One pass: a thread's
// 16 loads are all issued before its first use, and the row is quantised from registers (reading Q twice in
// load-then-store loops chained ~8 memory latencies: the query tile landed ~10 µs after entry, against ~7 µs
// for the bf16 kernel's batched load_q_tile; bench/results/mla_sm90_fp8mma_independent_wgs_2026-12-06_2041_h100/).
__device__ __forceinline__ void quantize_q_latent(const MlaSm90Args& p, const Work& w, const Frag& f, uint8_t* dst,
                                                  float* q_scale) {
  const int r = f.tid / 4, quarter = f.tid % 4, row = w.row0 + r;
  const bool live = row < w.rows_total;
  const __nv_bfloat16* qrow = static_cast<const __nv_bfloat16*>(p.q);
  if (live) qrow += (w.q_start + row / w.H) * p.q_stride_t + static_cast<int64_t>(row % w.H) * p.q_stride_h;
  uint4 v[16];
#pragma unroll
  for (int c = 0; c < 16; ++c)
    v[c] = live ? __ldg(reinterpret_cast<const uint4*>(qrow + quarter * 128 + c * 8)) : make_uint4(0, 0, 0, 0);
  float amax = 0.f;
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[c]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 x = __bfloat1622float2(h2[e]);
      amax = fmaxf(amax, fmaxf(fabsf(x.x), fabsf(x.y)));
    }
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 2));
  const float inv = amax > 0.f ? 448.f / amax : 0.f;
  if (quarter == 0) q_scale[r] = amax / 448.f;
#pragma unroll
  for (int c = 0; c < 8; ++c) {  // 16 columns a store: chunks 2c and 2c + 1
    uint32_t packed[4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v[2 * c + half]);
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const float2 a = __bfloat1622float2(h2[e]), b = __bfloat1622float2(h2[e + 1]);
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a.x * inv, a.y * inv), __NV_SATFINITE, __NV_E4M3);
        const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(b.x * inv, b.y * inv), __NV_SATFINITE, __NV_E4M3);
        packed[half * 2 + e / 2] = lo | (hi << 16);
      }
    }
    *reinterpret_cast<uint4*>(dst + swizzled_offset_8bit(r, quarter * 128 + c * 16)) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

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

// Online softmax, part 2: new running max, rescale the accumulator and the row sums, write
// P * p_mul (bf16) for this warpgroup's 32 keys into the swizzled [64, 64] P tile.
template <bool kScaleP>
__device__ __forceinline__ void tile_probs(const float (&s)[16], const float (&p_mul)[16], const float (&mx)[2],
                                           float (&m_run)[2], float (&l_run)[2], float (&acc)[128],
                                           uint8_t* p_tile, const Frag& f) {
  float m_use[2], alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(m_run[h], mx[h]);
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = exp2f(m_run[h] - m_use[h]);
    m_run[h] = m_new;
  }
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

// The latent column of N-row n of the FP8-MMA kernel's transposed V tile (transpose_latent: within a
// 16-column group the rows hold columns 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15), so of its
// accumulator column n. Pairs (2i, 2i + 1) stay adjacent.
__device__ __forceinline__ int vt_col(int n) {
  return (n & ~15) | (((n & 7) >> 1) << 2) | (((n >> 3) & 1) << 1) | (n & 1);
}

// Two / four adjacent output values: bf16 into the output, fp32 into a split's partial.
__device__ __forceinline__ void store2(__nv_bfloat16* dst, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}
__device__ __forceinline__ void store4(__nv_bfloat16* dst, float a, float b, float c, float d) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}
__device__ __forceinline__ void store4(float* dst, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
}

// Row h of this thread's accumulator, times inv, into the row's 512 outputs at o. In natural column order a
// thread's n8 block j is columns col0 + 8j + {0, 1}. In vt_col order (kVtCols: the FP8-MMA kernel) its blocks
// 2m and 2m + 1 are the four adjacent columns vt_col(col0 + 16m) + {0..3}, one 16-byte store (8 in bf16), so a
// quad writes 64 contiguous bytes; stored block by block at vt_col, each store covered two half sectors and the
// epilogue took ~11 µs instead of ~4 (bench/results/mla_sm90_fp8mma_independent_wgs_2026-12-06_2041_h100/). Rows
// are 16-byte aligned (sm90.py checks).
template <bool kVtCols, typename T>
__device__ __forceinline__ void store_row(T* o, const float (&acc)[128], int h, float inv, const Frag& f) {
  const int col0 = 256 * f.wg + 2 * (f.lane & 3);
  if constexpr (kVtCols) {
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      const int i = 8 * m + 2 * h;
      store4(o + vt_col(col0 + 16 * m), acc[i] * inv, acc[i + 1] * inv, acc[i + 4] * inv, acc[i + 5] * inv);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int i = 4 * j + 2 * h;
      store2(o + col0 + 8 * j, acc[i] * inv, acc[i + 1] * inv);
    }
  }
}

// The output (one split) or this split's normalised partial and its log2-LSE. kVtCols: the accumulator's
// columns are in vt_col order (the FP8-MMA kernel); out_mul: a factor the accumulator carries (1 / c there).
template <bool kVtCols = false>
__device__ __forceinline__ void write_out(const MlaSm90Args& p, const Work& w, const Frag& f, const float (&acc)[128],
                                          const float (&m_run)[2], float (&l_run)[2], float* red_sum,
                                          float out_mul = 1.f) {
#pragma unroll
  for (int h = 0; h < 2; ++h) l_run[h] = warp_sum4(l_run[h]);
  if ((f.lane & 3) == 0) {
    red_sum[f.wg * kRows + f.r_lo] = l_run[0];
    red_sum[f.wg * kRows + f.r_hi] = l_run[1];
  }
  named_barrier_sync(1, kConsumerThreads);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? f.r_hi : f.r_lo;
    const int row = w.row0 + r;
    if (row >= w.rows_total) continue;
    const float l = red_sum[r] + red_sum[kRows + r];
    const float inv = l > 0.f ? out_mul / l : 0.f;
    const float lse2 = l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
    const int64_t tok = w.q_start + row / w.H, head = row % w.H;
    if (p.num_splits == 1) {
      store_row<kVtCols>(static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_t + head * p.out_stride_h, acc, h,
                         inv, f);
      if (p.lse != nullptr && f.wg == 0 && (f.lane & 3) == 0) p.lse[tok * w.H + head] = lse2 * 0.6931471805599453f;
    } else {
      store_row<kVtCols>(p.partial_out + tok * p.po_stride_t + head * p.po_stride_h + w.split * p.po_stride_s, acc, h,
                         inv, f);
      if (f.wg == 0 && (f.lane & 3) == 0) p.partial_lse[(tok * w.H + head) * p.num_splits + w.split] = lse2;
    }
  }
}

// Widen 16 e4m3 latent values (key, col..col+15) of a stage to bf16 (value * 2^-120) in the V tile.
__device__ __forceinline__ void widen_chunk(const uint8_t* stage, uint8_t* v_tile, int key, int col) {
  const uint4 x = *reinterpret_cast<const uint4*>(stage + swizzled_offset_8bit(key, col));
  const uint2 a = e4m3x4_to_bf16x4_scaled(x.x), b = e4m3x4_to_bf16x4_scaled(x.y);
  const uint2 c = e4m3x4_to_bf16x4_scaled(x.z), d = e4m3x4_to_bf16x4_scaled(x.w);
  *reinterpret_cast<uint4*>(v_tile + swizzled_offset(key, col)) = make_uint4(a.x, a.y, b.x, b.y);
  *reinterpret_cast<uint4*>(v_tile + swizzled_offset(key, col + 8)) = make_uint4(c.x, c.y, d.x, d.y);
}

// Producer: the token row of each box of min(page_size, 64) tokens of a tile (page id from the page
// table). Pieces past the request's last page re-read its last page (finite data, masked in S).
__device__ __forceinline__ int box_row(const MlaSm90Args& p, const int32_t* pt, int key, int last_page) {
  const int page = pt[min(key / p.page_size, last_page)];
  return page * p.page_size + (key & (p.page_size - 1));
}

// The producer lane's loop: for each tile, wait for its stage to be free, arm the full barrier with the
// tile's bytes and issue(stage, box, box_rows, row, bar) per box. The page ids of tile i + 1 are read
// right after tile i is issued, so their latency hides behind the wait for the stage, not in front of
// the refill.
template <int kNumStages = kStages, typename Issue>
__device__ __forceinline__ void produce(const MlaSm90Args& p, const Work& w, uint32_t full_bar, uint32_t empty_bar,
                                        uint32_t tx_bytes, Issue issue) {
  constexpr int kMaxBoxes = kKeys / 8;  // page_size >= 8
  const int box_rows = min(p.page_size, kKeys), boxes = kKeys / box_rows, last_page = (w.kv_len - 1) / p.page_size;
  const int32_t* pt = p.page_table + static_cast<int64_t>(w.b) * p.page_table_stride;
  int rows[kMaxBoxes];
  WaitCycles empty_waits;
#pragma unroll
  for (int j = 0; j < kMaxBoxes; ++j)
    if (j < boxes && w.n_tiles > 0) rows[j] = box_row(p, pt, w.start + j * box_rows, last_page);
  for (int i = 0; i < w.n_tiles; ++i) {
    const int stage = i % kNumStages;
    empty_waits.start();
    if (i >= kNumStages) mbar_wait(empty_bar + 8 * stage, ((i / kNumStages) - 1) & 1);
    empty_waits.stop();
    const uint32_t bar = full_bar + 8 * stage;
    mbar_expect_tx(bar, tx_bytes);
#pragma unroll
    for (int j = 0; j < kMaxBoxes; ++j)
      if (j < boxes) issue(stage, j, box_rows, rows[j], bar);
    stamp(p, kPhaseFirstTma, i == 0);
    stamp(p, kPhaseLastTma, i == w.n_tiles - 1);
    if (i + 1 < w.n_tiles) {
#pragma unroll
      for (int j = 0; j < kMaxBoxes; ++j)
        if (j < boxes) rows[j] = box_row(p, pt, w.start + (i + 1) * kKeys + j * box_rows, last_page);
    }
  }
  record(p, kCountProducerWaitEmpty, true, &empty_waits);
}

__device__ __forceinline__ void init_barriers(uint32_t full_bar, uint32_t empty_bar) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, kConsumerThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw, uint32_t& base) {
  const uint32_t addr = smem_addr(raw);
  const uint32_t pad = ((addr + 1023) & ~1023u) - addr;
  base = addr + pad;
  return raw + pad;
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
  const uint32_t full_bar = base + kBar, empty_bar = full_bar + kStages * 8;
  init_barriers(full_bar, empty_bar);

  if (threadIdx.x >= kConsumerThreads) {  // ---- producer warpgroup ----
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == kConsumerThreads) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&kv_map)) : "memory");
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
  const uint32_t full_bar = base + kBar, empty_bar = full_bar + kStages * 8;
  init_barriers(full_bar, empty_bar);

  if (threadIdx.x >= kConsumerThreads) {  // ---- producer warpgroup ----
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == kConsumerThreads) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&lat_map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&rope_map)) : "memory");
      produce(p, w, full_bar, empty_bar, L::kTxBytes, [&](int stage, int j, int box_rows, int row, uint32_t bar) {
        const uint32_t dst = base + kStage0 + stage * kStageBytes + j * box_rows * 128;
#pragma unroll
        for (int c = 0; c < 4; ++c) tma_load_2d(dst + c * kBlockBytes, &lat_map, c * 128, row, bar);
        tma_load_2d(dst + kLatBytes, &rope_map, 0, row, bar);
        bulk_load(base + kScales + stage * kKeys * 4 + j * box_rows * 4, p.scale + row, box_rows * 4, bar);
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

// ---- the FP8-MMA kernel: S and P V on e4m3 wgmma ----------------------------------------------------
// As the e4m3-scores kernel for S (Q quantised per row, S_latent in two fp32 halves of K, S_rope bf16).
// For P V, each consumer warpgroup transposes its half of the landed latent tile into V^T (transpose_latent)
// while its S MMAs run, the tile's P multiplier c = 256 / its largest k_scale comes out of the row-maximum
// exchange, and the consumers write P' = p * k_scale * c as e4m3 (<= 256: e4m3's range with 2^-17 of
// headroom below) and run O[64, 256] += P'[64, 64] V^T on e4m3 wgmma (m64n256k32), the accumulator kept
// times the current tile's c (rescaled by c / c_prev with the softmax's alpha, divided out at the end).

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

// Part 2: c = 256 / the tile's largest |k_scale| over the keys some row sees, rounded down to a power of two
// (1 when that is ~0). A power of two keeps P' <= 256 and makes c / c_prev exact and, tile after tile, mostly
// 1, so tile_probs_e4m3 can skip the accumulator's rescale whenever no row's max moved either.
__device__ __forceinline__ float tile_multiplier(const float* red_scale) {
  float mx = 0.f;
#pragma unroll
  for (int w = 0; w < kConsumerThreads / 32; ++w) mx = fmaxf(mx, red_scale[w]);
  return mx > 1e-30f ? __int_as_float(__float_as_int(256.f / mx) & 0x7f800000) : 1.f;
}

// Online softmax, part 2 of the FP8-MMA kernel: as tile_probs, but P' = p * ks * c goes to the P tile as
// e4m3 in transpose_latent's key-slot order, and the accumulator (kept times c) is to be rescaled by
// rescale = alpha * c / c_prev once the last tile's P V is done (rescale_acc). Slots: this thread's keys 2q, 2q + 1, 8 + 2q, 9 + 2q of a 16-key group (q = lane % 4)
// are slots 4q, 4q + 2, 4q + 1, 4q + 3, so each row's four values of a group are one 32-bit store.
__device__ __forceinline__ void tile_probs_e4m3(const float (&s)[16], const float (&ks)[16], float c, float c_prev,
                                                const float (&mx)[2], float (&m_run)[2], float (&l_run)[2],
                                                float (&rescale)[2], uint8_t* p_tile, const Frag& f) {
  float m_use[2], alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(m_run[h], mx[h]);
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = exp2f(m_run[h] - m_use[h]);
    m_run[h] = m_new;
  }
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
  const uint32_t full_bar = base + kBar, empty_bar = full_bar + 8 * kRing;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kRing; ++st) {
      mbar_init(full_bar + 8 * st, 1);
      mbar_init(empty_bar + 8 * st, kConsumerThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= kConsumerThreads) {  // ---- producer warpgroup: one lane issues the loads ----
    setmaxnreg_dec<kLoaderRegs>();
    if (threadIdx.x == kConsumerThreads) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&lat_map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&rope_map)) : "memory");
      produce<kRing>(p, w, full_bar, empty_bar, kTxBytes, [&](int stage, int j, int box_rows, int row, uint32_t bar) {
        const uint32_t dst = base + kStage0 + stage * kStageBytes + j * box_rows * 128;
#pragma unroll
        for (int c = 0; c < 4; ++c) tma_load_2d(dst + c * kBlockBytes, &lat_map, c * 128, row, bar);
        tma_load_2d(dst + kLatBytes, &rope_map, 0, row, bar);
        bulk_load(base + kScales + stage * kKeys * 4 + j * box_rows * 4, p.scale + row, box_rows * 4, bar);
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
  auto issue_tile_s = [&](int it) {  // wait for tile it to land, issue its S
    full_waits.start();
    mbar_wait(full_bar + 8 * (it % kRing), (it / kRing) & 1);
    full_waits.stop();
    stamp(p, kPhaseFirstTile, f.tid == 0 && it == 0);
    issue_s_e4m3(s_lat0, s_lat1, s_rope, base + kQ, base + kQRope, base + kStage0 + (it % kRing) * kStageBytes, f.wg);
  };
  auto transpose_tile = [&](int it) {  // V^T buffer it % 2 was last read by P V of tile it - 2, waited for
    transposing.start();
    transpose_latent(base + kStage0 + (it % kRing) * kStageBytes, base + kVt + (it % kVtBufs) * kVtBytes,
                     w.end - (w.start + it * kKeys), f.wg, warp, f.lane);
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

#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
__global__ void globaltimer_mark_kernel(uint64_t* out_ns) { *out_ns = globaltimer_ns(); }
#endif

void set_err(char* err, int errlen, const char* msg, int code) {
  if (err != nullptr && errlen > 0) snprintf(err, errlen, "%s (%d)", msg, code);
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(char* err, int errlen) {
  // The cuTensorMapEncodeTiled driver entry point, looked up once through the runtime (no -lcuda).
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      set_err(err, errlen, "cuTensorMapEncodeTiled not found", static_cast<int>(e));
      return nullptr;
    }
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  return encode;
}

// A [tokens, cols] cache tensor with a byte stride between tokens, read in 128B-swizzled boxes of
// [box_rows tokens, box_cols elements] (box_cols * element size = 128 bytes).
bool encode_map(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap* map, CUtensorMapDataType dtype,
                const void* ptr, int64_t cols, int64_t tokens, int64_t stride_bytes, int box_cols, int box_rows,
                char* err, int errlen) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(tokens)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(map, dtype, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) set_err(err, errlen, "cuTensorMapEncodeTiled failed", static_cast<int>(r));
  return r == CUDA_SUCCESS;
}

// The shared-memory opt-in is per device and kernel: remembered in a bit per device ordinal.
template <typename Kernel>
int opt_in_smem(Kernel kernel, int bytes, unsigned long long& done, char* err, int errlen) {
  int device = 0;
  cudaGetDevice(&device);
  if (device < 64 && (done >> device & 1ull)) return 0;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) {
    set_err(err, errlen, cudaGetErrorString(e), static_cast<int>(e));
    return static_cast<int>(e);
  }
  if (device < 64) done |= 1ull << device;
  return 0;
}

}  // namespace

int mla_sm90_smem_bytes() { return bf16l::kSmemBytes; }
int mla_sm90_fp8_smem_bytes(bool fp8_scores, bool fp8_pv) {
  if (fp8_scores && fp8_pv) return fp8mma::kSmemBytes;
  return fp8_scores ? Fp8Layout<true>::kSmemBytes : Fp8Layout<false>::kSmemBytes;
}

int mla_sm90_decode_launch(const MlaSm90Args& a, cudaStream_t stream, char* err, int errlen) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder(err, errlen);
  if (encode == nullptr) return -1;
  if (a.page_size < 8 || a.page_size > 256 || (a.page_size & (a.page_size - 1)) != 0) {
    set_err(err, errlen, "page_size must be a power of two in 8..256", a.page_size);
    return -1;
  }
  const int box_rows = a.page_size < kKeys ? a.page_size : kKeys;
  const dim3 grid(a.num_splits, a.row_tiles, a.batch);
  static unsigned long long bf16_opted = 0, fp8_opted = 0, fp8s_opted = 0;
  if (!a.fp8) {
    CUtensorMap map;
    if (!encode_map(encode, &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.kv, kDim, a.kv_num_tokens,
                    a.kv_stride_token * 2, 64, box_rows, err, errlen))
      return -1;
    if (const int rc = opt_in_smem(mla_decode_sm90_bf16_kernel, bf16l::kSmemBytes, bf16_opted, err, errlen)) return rc;
    if (a.batch == 0 || a.row_tiles == 0) return 0;
    mla_decode_sm90_bf16_kernel<<<grid, kThreads, bf16l::kSmemBytes, stream>>>(map, a);
  } else {
    CUtensorMap lat, rope;
    if (!encode_map(encode, &lat, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.kv, 512, a.kv_num_tokens, a.kv_stride_token,
                    128, box_rows, err, errlen) ||
        !encode_map(encode, &rope, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.rope, 64, a.kv_num_tokens,
                    a.rope_stride_token * 2, 64, box_rows, err, errlen))
      return -1;
    static unsigned long long fp8mma_opted = 0;
    if (a.fp8_scores && a.fp8_pv) {
      constexpr int bytes = fp8mma::kSmemBytes;
      if (const int rc = opt_in_smem(mla_decode_sm90_fp8mma_kernel, bytes, fp8mma_opted, err, errlen)) return rc;
      if (a.batch == 0 || a.row_tiles == 0) return 0;
      mla_decode_sm90_fp8mma_kernel<<<grid, kThreads, bytes, stream>>>(lat, rope, a);
    } else if (a.fp8_scores) {
      constexpr int bytes = Fp8Layout<true>::kSmemBytes;
      if (const int rc = opt_in_smem(mla_decode_sm90_fp8_kernel<true>, bytes, fp8s_opted, err, errlen)) return rc;
      if (a.batch == 0 || a.row_tiles == 0) return 0;
      mla_decode_sm90_fp8_kernel<true><<<grid, kThreads, bytes, stream>>>(lat, rope, a);
    } else {
      constexpr int bytes = Fp8Layout<false>::kSmemBytes;
      if (const int rc = opt_in_smem(mla_decode_sm90_fp8_kernel<false>, bytes, fp8_opted, err, errlen)) return rc;
      if (a.batch == 0 || a.row_tiles == 0) return 0;
      mla_decode_sm90_fp8_kernel<false><<<grid, kThreads, bytes, stream>>>(lat, rope, a);
    }
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    set_err(err, errlen, cudaGetErrorString(e), static_cast<int>(e));
    return static_cast<int>(e);
  }
  return 0;
}

#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
int mla_sm90_globaltimer_mark(uint64_t* out_ns, cudaStream_t stream) {
  globaltimer_mark_kernel<<<1, 1, 0, stream>>>(out_ns);
  return static_cast<int>(cudaGetLastError());
}
#endif

}  // namespace lightspeed_mla
