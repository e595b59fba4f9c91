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
// Page sizes 8..256 (powers of two): a tile is one page piece of min(page_size, 64) tokens or several.
// Phase timers: built with -DLIGHTSPEED_MLA_PHASE_TIMERS, each CTA stamps %globaltimer at the boundaries
// of mla_decode_sm90.h's MlaPhase into MlaSm90Args::phase_ns (tools/bench/mla_phases.py reads them);
// without the define stamp() is empty and the kernels compile to the production code exactly.
//
// This header holds what every kernel shares: the CTA's shape and register budget, its work, the phase
// timers, the query tiles, the producer lane's loop. The kernels: mla_decode_sm90_bf16.cu (bf16 cache; FP8
// cache widened to bf16 for P V, S on bf16 or e4m3 MMAs), mla_decode_sm90_fp8mma.cu (FP8 cache, both
// products on e4m3 MMAs); the consumers' per-tile pieces: sm90_decode_tile.cuh; the host side:
// mla_decode_sm90.cu.
#pragma once

#include <cmath>

#include "mla_decode_sm90.h"
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

// The ring's mbarriers: kNumStages full ones at full_bar (one arrival: the producer's, plus the TMA bytes),
// then kNumStages empty ones (every consumer thread arrives). Returns the first empty barrier's address.
template <int kNumStages = kStages>
__device__ __forceinline__ uint32_t init_barriers(uint32_t full_bar) {
  const uint32_t empty_bar = full_bar + 8 * kNumStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kNumStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, kConsumerThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  return empty_bar;
}

// One box of an FP8-cache stage (both FP8 layouts): the e4m3 latent's four 128-column blocks at `stage`, the bf16
// rope block after them, and the box's fp32 scales at `scales`.
__device__ __forceinline__ void load_fp8_box(const CUtensorMap* lat_map, const CUtensorMap* rope_map, const float* scale,
                                             uint32_t stage, uint32_t scales, int j, int box_rows, int row,
                                             uint32_t bar) {
  const uint32_t dst = stage + j * box_rows * 128;
#pragma unroll
  for (int c = 0; c < 4; ++c) tma_load_2d(dst + c * kBlockBytes, lat_map, c * 128, row, bar);
  tma_load_2d(dst + 4 * kBlockBytes, rope_map, 0, row, bar);
  bulk_load(scales + j * box_rows * 4, scale + row, box_rows * 4, bar);
}

__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw, uint32_t& base) {
  const uint32_t addr = smem_addr(raw);
  const uint32_t pad = ((addr + 1023) & ~1023u) - addr;
  base = addr + pad;
  return raw + pad;
}

}  // namespace
}  // namespace lightspeed_mla
