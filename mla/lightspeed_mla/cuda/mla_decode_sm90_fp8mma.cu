// The sm_90a MLA decode kernel for the FP8 cache with both products on e4m3 wgmma (the CTA's shape, its
// producer and consumers: sm90_decode_common.cuh).
// As the e4m3-scores kernel for S (Q quantised per row, S_latent in two fp32 halves of K, S_rope bf16).
// P V runs transposed, O^T[256 latent dims, 64 rows] += V^T P'^T a warpgroup, on e4m3 wgmma (m64n64k32) with V^T
// as the register operand: each consumer warp builds its fragments straight from the landed latent tile
// (load_v_frags: ldmatrix.trans and byte permutes), and P'^T is the P tile as the softmax writes it. The tile's P
// multiplier c (448 / its largest k_scale, rounded down to a power of two) comes out of the row-maximum exchange,
// the consumers write P' = p * k_scale * c as e4m3 (in (224, 448] at most: e4m3's top binade), and the
// accumulator is kept times the current tile's c (rescaled by c / c_prev with the softmax's alpha, divided out at
// the end).

#include "sm90_decode_tile.cuh"
#include "sm90_launch.h"

namespace lightspeed_mla {
namespace {

// Shared memory of the FP8-MMA kernel (both products on e4m3 wgmma). P V reads V from the landed stage into
// registers, so a stage is held until the consumers' fragments of it are built, in the step after its S: three
// stages keep two tiles' loads in flight behind that.
namespace fp8mma {
constexpr int kRing = 3;                       // latent stages
constexpr int kQ = 0;                          // e4m3 [64, 512]: 4 blocks, 128B-swizzled
constexpr int kQRope = 4 * kBlockBytes;        // bf16 [64, 64]: 1 block
constexpr int kStage0 = kQRope + kBlockBytes;  // a stage: e4m3 latent (4 blocks), bf16 rope (1 block)
constexpr int kLatBytes = 4 * kBlockBytes, kStageBytes = kLatBytes + kBlockBytes;
constexpr int kTxBytes = kStageBytes + kKeys * 4;  // + the tile's fp32 scales
constexpr int kPBufs = 2;                          // P tiles: tile i + 1's is written while P V of tile i reads
constexpr int kPBytes = kRows * kKeys;
constexpr int kP = kStage0 + kRing * kStageBytes;  // e4m3 P [64 rows, 64 key slots], 64B-swizzled
constexpr int kScales = kP + kPBufs * kPBytes;     // float [kRing stages][64]
constexpr int kRedScale = kScales + kRing * kKeys * 4;  // float [8 consumer warps]: their largest k_scale
constexpr int kRedMax = kRedScale + 32;
constexpr int kRedSum = kRedMax + 2 * kRows * 4;
constexpr int kRescale = kRedSum + 2 * kRows * 4;  // float [64]: each row's factor for the accumulator
constexpr int kMoved = kRescale + kRows * 4;       // uint32 [4]: whether a factor of warpgroup 0's warp w moved
constexpr int kQScale = kMoved + 16;               // float [64]
constexpr int kBar = kQScale + kRows * 4;          // uint64 full[kRing], empty[kRing]
constexpr int kSmemBytes = kBar + 2 * kRing * 8 + 1024;
// Registers: the producer warpgroup only issues loads from one lane; the consumers hold P V's accumulator
// (128) and its A fragments (32) in flight while the next tile's softmax runs on S (48). setmaxnreg.inc only
// hands out what the CTA's other warps released of its launch share (168 x 384), so 32 / 240 hung the kernel.
constexpr int kLoaderRegs = 24, kMmaRegs = 240;
static_assert(128 * kLoaderRegs + kConsumerThreads * kMmaRegs <= kLaunchRegs * kThreads, "the CTA's registers");
static_assert(kP % 1024 == 0 && kPBytes % 1024 == 0, "64B-swizzled tiles: 512-byte aligned bases");
static_assert(kRescale % 8 == 0 && kMoved % 16 == 0, "rescale_acc's vector loads");
static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");
}  // namespace fp8mma

// This warp's A fragments of P V from a landed stage (e4m3 [64 keys, 512] in 128B-swizzled blocks of 128 columns,
// as TMA landed it): in M-chunk c, V^T rows = latent dims 256 wg + 64 c + 16 warp .. + 15, K = the tile's keys in
// two k-steps of 32, keys at or past `valid` zeroed (a page's tail past the request may hold NaN bytes, and
// 0 * NaN is NaN). One ldmatrix.trans a chunk and k-step reads the 16 dims of keys 32 ks + 0-7, 8-15, 16-23, 24-31
// as four 8x8 matrices of byte pairs (bank-conflict free: a matrix's 8 rows are 8 swizzled 16-byte chunks) and
// gives thread t dims 2 (t / 4), 2 (t / 4) + 1 of keys 2q, 2q + 1 of each (q = t % 4); the byte permutes pair key
// k with key k + 8, so K 4q .. 4q + 3 of a fragment row hold keys 2q, 8 + 2q, 2q + 1, 9 + 2q (the key-slot order
// tile_probs_e4m3 writes P in: the product is unchanged) and fragment row r is dim 2r, row r + 8 dim 2r + 1 of the
// warp's 16 (write_out_t puts them back). mla/scripts/sm90_emulate.py afrag checks the mapping byte for byte.
__device__ __forceinline__ void load_v_frags(uint32_t lat, int valid, int wg, int warp, int lane,
                                             uint32_t (&a)[4][2][4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t d[4];
      ldmatrix_x4_trans(lat + swizzled_offset_8bit(32 * ks + lane, 256 * wg + 64 * c + 16 * warp), d);
      a[c][ks][0] = __byte_perm(d[0], d[1], 0x6240);
      a[c][ks][1] = __byte_perm(d[0], d[1], 0x7351);
      a[c][ks][2] = __byte_perm(d[2], d[3], 0x6240);
      a[c][ks][3] = __byte_perm(d[2], d[3], 0x7351);
    }
  }
  if (valid >= kKeys) return;  // all but the split's last tile
#pragma unroll
  for (int k16 = 0; k16 < 4; ++k16) {  // a[.][k16 / 2][2 (k16 % 2) ..]: keys 16 k16 + 2q, + 8, + 1, + 9
    const int key = 16 * k16 + 2 * (lane & 3);
    const uint32_t keep = (key < valid ? 0xffu : 0u) | (key + 8 < valid ? 0xff00u : 0u) |
                          (key + 1 < valid ? 0xff0000u : 0u) | (key + 9 < valid ? 0xff000000u : 0u);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      a[c][k16 / 2][2 * (k16 % 2)] &= keep;
      a[c][k16 / 2][2 * (k16 % 2) + 1] &= keep;
    }
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
// e4m3 in load_v_frags' key-slot order, and the accumulator (kept times c) is to be rescaled by
// rescale = alpha * c / c_prev once the last tile's P V is done (publish_rescale, rescale_acc). Slots: this
// thread's keys 2q, 2q + 1, 8 + 2q, 9 + 2q of a 16-key group (q = lane % 4) are slots 4q, 4q + 2, 4q + 1, 4q + 3,
// so each row's four values of a group are one 32-bit store.
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

// The rows' accumulator factors for the O^T layout, where a thread holds 16 rows of the 64: warpgroup 0 (whose
// warps hold the softmax's rows 16w .. 16w + 15) publishes them and, a word a warp, whether any differs from 1.
// Read by rescale_acc after the consumers' next barrier.
__device__ __forceinline__ void publish_rescale(const float (&rescale)[2], float* red_rescale, uint32_t* moved,
                                                const Frag& f) {
  if (f.wg != 0) return;
  if ((f.lane & 3) == 0) {
    red_rescale[f.r_lo] = rescale[0];
    red_rescale[f.r_hi] = rescale[1];
  }
  const bool any = __any_sync(0xffffffff, rescale[0] != 1.f || rescale[1] != 1.f);
  if (f.lane == 0) moved[f.tid / 32] = any;
}

// 128 multiplies a thread on the path between two tiles' MMAs, by the factors of its rows 8j + 2q + {0, 1}
// (q = lane % 4); skipped when no row's max and no c moved, which is most tiles once a long context's max
// settles (every warp holds all 64 rows, so the skip is uniform).
__device__ __forceinline__ void rescale_acc(float (&acc)[4][32], const float* red_rescale, const uint32_t* moved,
                                            int lane) {
  const uint4 mv = *reinterpret_cast<const uint4*>(moved);
  if ((mv.x | mv.y | mv.z | mv.w) == 0) return;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 r = *reinterpret_cast<const float2*>(red_rescale + 8 * j + 2 * (lane & 3));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      acc[c][4 * j] *= r.x;
      acc[c][4 * j + 1] *= r.y;
      acc[c][4 * j + 2] *= r.x;
      acc[c][4 * j + 3] *= r.y;
    }
  }
}

// O^T[this warpgroup's 256 latent dims, 64 rows] += V^T P'^T: per k-step of 32 key slots, the 4 M-chunks of 64
// dims, A = this warp's fragments (load_v_frags), B = P'^T, which is the P tile [64 rows, 64 slots] read as it is
// (K-major). Committed, not waited.
__device__ __forceinline__ void issue_pv_e4m3(float (&acc)[4][32], uint32_t (&a)[4][2][4], uint32_t p_base) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    fence_regs(acc[c]);
    fence_regs(a[c][0]);  // the fragments built before the fence (else ptxas injects one at each wgmma)
    fence_regs(a[c][1]);
  }
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKeys / 32; ++ks)
#pragma unroll
    for (int c = 0; c < 4; ++c) wgmma_m64n64k32_e4m3_rs(acc[c], a[c][ks], smem_desc_64b(p_base + 32 * ks), 1);
  wgmma_commit();
}

// The output (one split) or this split's normalised partial and its log2-LSE, from O^T: element i of chunk c is
// latent dim 256 wg + 64 c + 16 warp + 2 (lane / 4) + ((i >> 1) & 1) (load_v_frags' fragment rows) of query row
// 8 (i >> 2) + 2 (lane % 4) + (i & 1). So a thread stores dim pairs of 16 rows, and a warp's 8 lanes of one
// lane % 4 write 16 dims of a row: 64 contiguous bytes (32 in bf16). out_mul: 1 / c, which the accumulator carries.
__device__ __forceinline__ void write_out_t(const MlaSm90Args& p, const Work& w, const Frag& f,
                                            const float (&acc)[4][32], const float (&m_run)[2], float (&l_run)[2],
                                            float* red_sum, float out_mul) {
  // The request's first token and row count read again, and the LSE rows' token index divided anew (an empty
  // asm keeps make_frag's quotient from being reused): carried across the tile loop, they spilled (ptxas).
  const int q_start = p.query_start[w.b], rows_total = (p.query_start[w.b + 1] - q_start) * w.H;
  publish_row_sums(f, l_run, red_sum);
  if (f.wg == 0 && (f.lane & 3) == 0) {  // the LSE of the softmax's rows, whose m_run this thread holds
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int r = h ? f.r_hi : f.r_lo;
      asm volatile("" : "+r"(r));
      const int row = w.row0 + r;
      if (row >= rows_total) continue;
      const float l = red_sum[r] + red_sum[kRows + r];
      const float lse2 = l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
      const int64_t tok = q_start + row / w.H, head = row % w.H;
      if (p.num_splits > 1)
        p.partial_lse[(tok * w.H + head) * p.num_splits + w.split] = lse2;
      else if (p.lse != nullptr)
        p.lse[tok * w.H + head] = lse2 * 0.6931471805599453f;
    }
  }
  const int dim0 = 256 * f.wg + 16 * ((f.tid % 128) / 32) + 2 * (f.lane / 4);
#pragma unroll
  for (int i = 0; i < 32; i += 4) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = i / 4 * 8 + 2 * (f.lane & 3) + e, row = w.row0 + r;
      if (row >= rows_total) continue;
      const float l = red_sum[r] + red_sum[kRows + r];
      const float inv = l > 0.f ? out_mul / l : 0.f;
      const int64_t tok = q_start + row / w.H, head = row % w.H;
      auto store = [&](auto* o) {
#pragma unroll
        for (int c = 0; c < 4; ++c) store2(o + dim0 + 64 * c, acc[c][i + e] * inv, acc[c][i + 2 + e] * inv);
      };
      if (p.num_splits == 1)
        store(static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_t + head * p.out_stride_h);
      else
        store(p.partial_out + tok * p.po_stride_t + head * p.po_stride_h + w.split * p.po_stride_s);
    }
  }
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
  // full: the stage landed (TMA bytes); empty: S and the P V fragments are done with it.
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
  float* red_rescale = reinterpret_cast<float*>(smem + kRescale);
  uint32_t* moved = reinterpret_cast<uint32_t*>(smem + kMoved);
  if (w.n_tiles > 0) {
    quantize_q_latent(p, w, f, smem + kQ, q_scale);
    load_q_tile<8>(p, w, f, smem + kQRope, 512);  // Q's rope stays bf16
    fence_proxy_async();
  }
  named_barrier_sync(1, kConsumerThreads);
  stamp(p, kPhaseQLoaded, f.tid == 0);

  WaitCycles full_waits, building;
  float acc[4][32];  // O^T: M-chunk c of this warpgroup's 256 latent dims
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[c][i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, c_prev = 1.f;
  const int warp = (f.tid % 128) / 32;
  // Software pipelined, FlashAttention-3's intra-warpgroup overlap: a step issues S of tile i + 1, builds tile i's
  // P V fragments while S runs and issues P V of tile i; waits for S only and runs tile i + 1's softmax (into the
  // other P tile) while P V still runs; then waits for P V and, past the barrier that publishes the rows'
  // factors, rescales the accumulator. No MMA is in flight across the loop's back edge (ptxas serialises every
  // wgmma of a kernel whose in-flight accumulators it cannot keep in place: C7515).
  float s_lat0[16], s_lat1[16], s_rope[16];
  uint32_t a[4][2][4];  // this warp's P V fragments of one tile
  auto stage_base = [&](int it) { return base + kStage0 + (it % kRing) * kStageBytes; };
  auto p_tile = [&](int it) { return kP + (it % kPBufs) * kPBytes; };  // its offset
  auto issue_tile_s = [&](int it) {  // wait for tile it to land, issue its S
    full_waits.start();
    mbar_wait(full_bar + 8 * (it % kRing), (it / kRing) & 1);
    full_waits.stop();
    stamp(p, kPhaseFirstTile, f.tid == 0 && it == 0);
    issue_s_e4m3(s_lat0, s_lat1, s_rope, base + kQ, base + kQRope, stage_base(it), f.wg);
  };
  auto build_frags = [&](int it) {  // tile it's fragments; its S is done, so then its stage is free
    building.start();
    load_v_frags(stage_base(it), w.end - (w.start + it * kKeys), f.wg, warp, f.lane, a);
    building.stop();
    mbar_arrive(empty_bar + 8 * (it % kRing));
    stamp(p, kPhaseLastVt, f.tid == 0 && it == w.n_tiles - 1);
  };
  // Tile it's softmax from its S (waited for): P' into P tile it % 2 (last read by P V of tile it - 2, waited
  // for), the running max and sums updated, the rows' accumulator factors published.
  auto softmax_tile = [&](int it) {
    const int key0 = w.start + it * kKeys;
    const float* k_scale = reinterpret_cast<const float*>(smem + kScales) + (it % kRing) * kKeys;
    fence_regs(s_lat0);
    fence_regs(s_lat1);
    fence_regs(s_rope);
    const float q_mul[2] = {q_scale[f.r_lo], q_scale[f.r_hi]};  // read a tile: two registers less at its peak
    float s[16], ks[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int h = (i >> 1) & 1;
      const bool valid = key0 + frag_key(f, i) < f.limit[h];
      ks[i] = valid ? k_scale[frag_key(f, i)] : 0.f;  // garbage past the request: selected away
      s[i] = valid ? ((s_lat0[i] + s_lat1[i]) * (q_mul[h] * ks[i]) + s_rope[i]) * p.scale_log2 : -INFINITY;
    }
    float mx[2], rescale[2];
    warp_scale_max(ks, red_scale, f);
    tile_row_max(s, reinterpret_cast<float*>(smem + kRedMax), f, mx);
    const float c = tile_multiplier(red_scale);
    tile_probs_e4m3(s, ks, c, c_prev, mx, m_run, l_run, rescale, smem + p_tile(it), f);
    publish_rescale(rescale, red_rescale, moved, f);
    c_prev = c;
  };
  if (w.n_tiles > 0) {
    issue_tile_s(0);
    wgmma_wait_all();
    softmax_tile(0);  // its factors are not read: the accumulator is still zero
    fence_proxy_async();  // P before wgmma reads it
    named_barrier_sync(1, kConsumerThreads);
  }
  for (int it = 0; it + 1 < w.n_tiles; ++it) {  // the last tile's P V after the loop: no branch around a wait
    issue_tile_s(it + 1);
    build_frags(it);
    issue_pv_e4m3(acc, a, base + p_tile(it));
    wgmma_wait<1>();  // S of tile it + 1 (committed first); P V of tile it may still run
    softmax_tile(it + 1);
    wgmma_wait_all();
    fence_proxy_async();  // P of tile it + 1 before wgmma reads it
    named_barrier_sync(1, kConsumerThreads);
#pragma unroll
    for (int c = 0; c < 4; ++c) fence_regs(acc[c]);
    rescale_acc(acc, red_rescale, moved, f.lane);
  }
  if (w.n_tiles > 0) {
    build_frags(w.n_tiles - 1);
    issue_pv_e4m3(acc, a, base + p_tile(w.n_tiles - 1));
    wgmma_wait_all();
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) fence_regs(acc[c]);
  stamp(p, kPhaseLastPv, f.tid == 0 && w.n_tiles > 0);
  write_out_t(p, w, f, acc, m_run, l_run, reinterpret_cast<float*>(smem + kRedSum), 1.f / c_prev);
  stamp(p, kPhaseEpilogue, f.tid == 0);
  record(p, kCountClockEpilogue, f.tid == 0);
  record(p, kCountConsumerWaitFull, f.tid == 0, &full_waits);
  record(p, kCountConsumerTranspose, f.tid == 0, &building);
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
