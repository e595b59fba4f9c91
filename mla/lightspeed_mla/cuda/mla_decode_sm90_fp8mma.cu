// The sm_90a MLA decode kernel for the FP8 cache with both products on e4m3 wgmma (the CTA's shape, its
// producer and consumers: sm90_decode_common.cuh), its consumer warpgroups split by rows: warpgroup g owns query
// rows 32g .. 32g + 31 of the CTA's 64 and all 512 latent dims, so the two never exchange row maxima and run out
// of step (one's softmax and fragment build beside the other's MMAs).
// S runs transposed, S^T[64 keys, 32 rows] = K Q^T (m64n32: Q quantised per row, S_latent in two fp32 halves of K,
// S_rope bf16). P V runs transposed too, O^T[512 latent dims, 32 rows] += V^T P'^T, on e4m3 wgmma (m64n32k32) with
// V^T as the register operand: each consumer warp builds its fragments straight from the landed latent tile
// (load_v_frags: ldmatrix.trans and byte permutes), and P'^T is the warpgroup's P tile as the softmax writes it.
// S^T and O^T map a thread to the same 8 query rows (N columns 8j + 2q + {0, 1}, q = lane % 4), so a thread
// rescales its accumulator by its own softmax rows' factors. The tile's P multiplier c (448 / its largest
// k_scale, rounded down to a power of two) comes out of the warpgroup's row-maximum exchange, the consumers write
// P' = p * k_scale * c as e4m3 (in (224, 448] at most: e4m3's top binade), and the accumulator is kept times the
// current tile's c (rescaled by c / c_prev with the softmax's alpha, divided out at the end).

#include "sm90_decode_tile.cuh"
#include "sm90_launch.h"

namespace lightspeed_mla {
namespace {

// Shared memory of the FP8-MMA kernel (both products on e4m3 wgmma). A warpgroup's loop is serial (S, softmax,
// fragments, P V), so a stage is held until both warpgroups built their fragments of it: three stages keep two
// tiles' loads in flight behind the slower one.
namespace fp8mma {
constexpr int kRing = 3;                       // latent stages
constexpr int kQ = 0;                          // e4m3 [64, 512]: 4 blocks, 128B-swizzled
constexpr int kQRope = 4 * kBlockBytes;        // bf16 [64, 64]: 1 block
constexpr int kStage0 = kQRope + kBlockBytes;  // a stage: e4m3 latent (4 blocks), bf16 rope (1 block)
constexpr int kLatBytes = 4 * kBlockBytes, kStageBytes = kLatBytes + kBlockBytes;
constexpr int kTxBytes = kStageBytes + kKeys * 4;  // + the tile's fp32 scales
constexpr int kWgRows = kRows / 2;                 // a warpgroup's query rows
constexpr int kPBytes = kWgRows * kKeys;
constexpr int kP = kStage0 + kRing * kStageBytes;  // a warpgroup's e4m3 P [32 rows, 64 key slots], 64B-swizzled
constexpr int kScales = kP + 2 * kPBytes;          // float [kRing stages][64]
constexpr int kRedScale = kScales + kRing * kKeys * 4;  // float [2 warpgroups][4 warps]: their largest k_scale
constexpr int kRedMax = kRedScale + 32;                 // float [2 warpgroups][4 warps][32 rows]
constexpr int kRedSum = kRedMax + 2 * 4 * kWgRows * 4;  // as kRedMax
constexpr int kLimit = kRedSum + 2 * 4 * kWgRows * 4;   // int [64]: each row's causal key limit
constexpr int kQScale = kLimit + kRows * 4;             // float [64]
constexpr int kBar = kQScale + kRows * 4;               // uint64 full[kRing], empty[kRing]
constexpr int kSmemBytes = kBar + 2 * kRing * 8 + 1024;
// Registers: the producer warpgroup only issues loads from one lane; a consumer holds P V's accumulator (128)
// always, S (48) until the tile's softmax, then its A fragments (64): 176 or 192 at a time, never all three.
// setmaxnreg.inc only hands out what the CTA's other warps released of its launch share (168 x 384), so 32 / 240
// hung the kernel.
constexpr int kLoaderRegs = 24, kMmaRegs = 240;
static_assert(128 * kLoaderRegs + kConsumerThreads * kMmaRegs <= kLaunchRegs * kThreads, "the CTA's registers");
static_assert(kP % 1024 == 0 && kPBytes % 512 == 0, "64B-swizzled tiles: 512-byte aligned bases");
static_assert(kRedMax % 8 == 0 && kRedSum % 8 == 0 && kLimit % 8 == 0 && kQScale % 8 == 0, "float2 / int2 reads");
static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");
}  // namespace fp8mma
using fp8mma::kWgRows;

// This warp's A fragments of P V from a landed stage (e4m3 [64 keys, 512] in 128B-swizzled blocks of 128 columns,
// as TMA landed it): in M-chunk c, V^T rows = latent dims 64 c + 16 warp .. + 15, K = the tile's keys in two
// k-steps of 32, keys at or past `valid` zeroed (a page's tail past the request may hold NaN bytes, and
// 0 * NaN is NaN). One ldmatrix.trans a chunk and k-step reads the 16 dims of keys 32 ks + 0-7, 8-15, 16-23, 24-31
// as four 8x8 matrices of byte pairs (bank-conflict free: a matrix's 8 rows are 8 swizzled 16-byte chunks) and
// gives thread t dims 2 (t / 4), 2 (t / 4) + 1 of keys 2q, 2q + 1 of each (q = t % 4); the byte permutes pair key
// k with key k + 8, so K 4q .. 4q + 3 of a fragment row hold keys 2q, 8 + 2q, 2q + 1, 9 + 2q (the key-slot order
// softmax_tile_t writes P in: the product is unchanged) and fragment row r is dim 2r, row r + 8 dim 2r + 1 of the
// warp's 16 (write_out_t puts them back). mla/scripts/sm90_emulate.py afrag checks the mapping byte for byte.
__device__ __forceinline__ void load_v_frags(uint32_t lat, int valid, int warp, int lane, uint32_t (&a)[8][2][4]) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t d[4];
      ldmatrix_x4_trans(lat + swizzled_offset_8bit(32 * ks + lane, 64 * c + 16 * warp), d);
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
    for (int c = 0; c < 8; ++c) {
      a[c][k16 / 2][2 * (k16 % 2)] &= keep;
      a[c][k16 / 2][2 * (k16 % 2) + 1] &= keep;
    }
  }
}

// S^T[the tile's 64 keys, this warpgroup's 32 rows] = K Q^T: S_latent on e4m3 MMAs in two fp32 halves of K
// (Hopper's e4m3 MMAs accumulate with reduced precision), S_rope in bf16; A = the landed stage (K-major, keys as
// rows), B = the warpgroup's rows of Q (K-major; 32 rows are 4 whole swizzle atoms, so a plain offset). Issued and
// committed as one group, not waited.
__device__ __forceinline__ void issue_st_e4m3(float (&s_lat0)[16], float (&s_lat1)[16], float (&s_rope)[16],
                                              uint32_t q_lat, uint32_t q_rope, uint32_t st_base) {
  using fp8mma::kLatBytes;
  fence_regs(s_lat0);
  fence_regs(s_lat1);
  fence_regs(s_rope);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // latent columns 0-255
    const uint32_t kofs = (k >> 2) * kBlockBytes + (k & 3) * 32;
    wgmma_m64n32k32_e4m3(s_lat0, smem_desc(st_base + kofs, 16), smem_desc(q_lat + kofs, 16), k > 0);
  }
#pragma unroll
  for (int k = 8; k < 16; ++k) {  // latent columns 256-511
    const uint32_t kofs = (k >> 2) * kBlockBytes + (k & 3) * 32;
    wgmma_m64n32k32_e4m3(s_lat1, smem_desc(st_base + kofs, 16), smem_desc(q_lat + kofs, 16), k > 8);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    wgmma_m64n32_ss(s_rope, smem_desc(st_base + kLatBytes + k * 32, 16), smem_desc(q_rope + k * 32, 16), k > 0);
  wgmma_commit();
}

// The tile's P multiplier c = 448 (e4m3's largest finite value) / its largest |k_scale| over the keys before the
// split's end (this warpgroup's 4 warps' maxima), rounded down to a power of two (1 when that is ~0). A power of
// two keeps P' <= 448 and makes c / c_prev exact and, tile after tile, mostly 1, so the accumulator's rescale is
// skipped whenever no row's max moved either.
__device__ __forceinline__ float tile_multiplier(const float* red_scale) {
  const float mx = fmaxf(fmaxf(red_scale[0], red_scale[1]), fmaxf(red_scale[2], red_scale[3]));
  return mx > 1e-30f ? __int_as_float(__float_as_int(448.f / mx) & 0x7f800000) : 1.f;
}

// The warpgroup's 128 threads (ids 2 and 3; 1 is both consumer warpgroups'): immediate ids, so ptxas reserves
// only the barriers used.
__device__ __forceinline__ void wg_barrier(int wg) {
  if (wg == 0)
    named_barrier_sync(2, 128);
  else
    named_barrier_sync(3, 128);
}

// A consumer thread's place in S^T and O^T (both m64n32 accumulators): element i is M row 16 warp + lane / 4 +
// 8 ((i >> 1) & 1) (a key of S^T, a dim pair's fragment row of O^T) and N column 8 (i >> 2) + 2 (lane % 4) + (i & 1),
// the warpgroup's query row; the thread's row r = 2j + e (0..7) is N column 8j + 2 (lane % 4) + e.
struct RowSplit {
  int wg, warp, lane;
};

// Online softmax of a tile for the warpgroup's 32 rows, from its S^T (waited for): the row maxima over the 64
// keys (lanes of one lane % 4, then the 4 warps through shared memory behind the warpgroup's barrier), P' =
// p * k_scale * c into the warpgroup's P tile as e4m3 in load_v_frags' key-slot order (a row's keys m, m + 8 of
// a 16-key group are slots 2m, 2m + 1: with lane ^ 4's keys m + 1, m + 9 one 32-bit store), the running max and
// this thread's partial row sums updated, and each row's accumulator factor alpha * c / c_prev into rescale.
// Returns whether any factor of the warp differs from 1 (warp-uniform).
__device__ __forceinline__ bool softmax_tile_t(const float (&s_lat0)[16], const float (&s_lat1)[16],
                                               const float (&s_rope)[16], const float* k_scale, int key0, int valid,
                                               const int* limit, const float* q_scale, float scale_log2,
                                               float* red_scale, float* red_max, uint8_t* p_tile, const RowSplit& t,
                                               float (&m_run)[8], float (&l_run)[8], float (&rescale)[8],
                                               float& c_prev) {
  const int q = t.lane & 3, m = t.lane >> 2, key_lo = 16 * t.warp + m;  // this thread's keys: key_lo, key_lo + 8
  float ks[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) ks[h] = key_lo + 8 * h < valid ? k_scale[key_lo + 8 * h] : 0.f;  // else garbage
  float s[16];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 qm = *reinterpret_cast<const float2*>(q_scale + 8 * j + 2 * q);
    const int2 lim = *reinterpret_cast<const int2*>(limit + 8 * j + 2 * q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * j + 2 * h + e;
        const bool seen = key0 + key_lo + 8 * h < (e ? lim.y : lim.x);
        s[i] = seen ? ((s_lat0[i] + s_lat1[i]) * ((e ? qm.y : qm.x) * ks[h]) + s_rope[i]) * scale_log2 : -INFINITY;
      }
    }
  }
  float mx[8], smax = fmaxf(fabsf(ks[0]), fabsf(ks[1]));
#pragma unroll
  for (int r = 0; r < 8; ++r) mx[r] = fmaxf(s[4 * (r >> 1) + (r & 1)], s[4 * (r >> 1) + 2 + (r & 1)]);
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    smax = fmaxf(smax, __shfl_xor_sync(0xffffffff, smax, o));
#pragma unroll
    for (int r = 0; r < 8; ++r) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], o));
  }
  if (m == 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<float2*>(red_max + kWgRows * t.warp + 8 * j + 2 * q) = make_float2(mx[2 * j], mx[2 * j + 1]);
    if (q == 0) red_scale[t.warp] = smax;
  }
  wg_barrier(t.wg);  // the warpgroup's maxima; its last P V (waited for) no longer reads P
#pragma unroll
  for (int w4 = 0; w4 < 4; ++w4) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = *reinterpret_cast<const float2*>(red_max + kWgRows * w4 + 8 * j + 2 * q);
      mx[2 * j] = fmaxf(mx[2 * j], v.x);
      mx[2 * j + 1] = fmaxf(mx[2 * j + 1], v.y);
    }
  }
  const float c = tile_multiplier(red_scale), ratio = c / c_prev;
  c_prev = c;
  float m_use[8], alpha[8];
  advance_row_max(mx, m_run, m_use, alpha);
  uint32_t pk[8];  // row r's e4m3 pair: slots 2m, 2m + 1 of the warp's 16-key group
  bool moved = false;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int i = 4 * (r >> 1) + (r & 1);  // row r's keys key_lo, key_lo + 8: elements i, i + 2
    const float p0 = exp2f(s[i] - m_use[r]), p1 = exp2f(s[i + 2] - m_use[r]);
    l_run[r] = l_run[r] * alpha[r] + p0 + p1;
    pk[r] = __nv_cvt_float2_to_fp8x2(make_float2(p0 * ks[0] * c, p1 * ks[1] * c), __NV_SATFINITE, __NV_E4M3);
    rescale[r] = alpha[r] * ratio;
    moved |= rescale[r] != 1.f;
  }
  const int odd = m & 1;  // even m stores its rows e = 0 with lane ^ 4's pairs, odd m its rows e = 1
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t other = __shfl_xor_sync(0xffffffff, odd ? pk[2 * j] : pk[2 * j + 1], 4);
    const uint32_t word = odd ? other | (pk[2 * j + 1] << 16) : pk[2 * j] | (other << 16);
    *reinterpret_cast<uint32_t*>(p_tile + swizzled_offset_64b(8 * j + 2 * q + odd, 16 * t.warp + 2 * (m - odd))) =
        word;
  }
  return __any_sync(0xffffffff, moved);
}

// O^T[512 latent dims, the warpgroup's 32 rows] += V^T P'^T: per k-step of 32 key slots, the 8 M-chunks of 64 dims,
// A = this warp's fragments (load_v_frags), B = P'^T, which is the warpgroup's P tile [32 rows, 64 slots] read as
// it is (K-major). Committed, not waited.
__device__ __forceinline__ void issue_pv_e4m3(float (&acc)[8][16], uint32_t (&a)[8][2][4], uint32_t p_base) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    fence_regs(acc[c]);
    fence_regs(a[c][0]);  // the fragments built before the fence (else ptxas injects one at each wgmma)
    fence_regs(a[c][1]);
  }
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKeys / 32; ++ks)
#pragma unroll
    for (int c = 0; c < 8; ++c) wgmma_m64n32k32_e4m3_rs(acc[c], a[c][ks], smem_desc_64b(p_base + 32 * ks), 1);
  wgmma_commit();
}

// The output (one split) or this split's normalised partial and its log2-LSE, from O^T: element i of chunk c is
// latent dim 64 c + 16 warp + 2 (lane / 4) + ((i >> 1) & 1) (load_v_frags' fragment rows) of the warpgroup's query
// row 8 (i >> 2) + 2 (lane % 4) + (i & 1). So a thread stores dim pairs of 8 rows, and a warp's 8 lanes of one
// lane % 4 write 16 dims of a row: 64 contiguous bytes (32 in bf16). The rows' sums: this thread's partials over
// its keys, summed over the lanes of one lane % 4 and the 4 warps (red_sum, behind the warpgroup's barrier).
// out_mul: 1 / c, which the accumulator carries.
__device__ __forceinline__ void write_out_t(const MlaSm90Args& p, const Work& w, const RowSplit& t,
                                            const float (&acc)[8][16], const float (&m_run)[8], float (&l_run)[8],
                                            float* red_sum, float out_mul) {
  // The request's first token and row count read again: carried across the tile loop, they spilled (ptxas).
  const int q_start = p.query_start[w.b], rows_total = (p.query_start[w.b + 1] - q_start) * w.H;
  const int q = t.lane & 3, m = t.lane >> 2;
#pragma unroll
  for (int o = 4; o < 32; o <<= 1)
#pragma unroll
    for (int r = 0; r < 8; ++r) l_run[r] += __shfl_xor_sync(0xffffffff, l_run[r], o);
  if (m == 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<float2*>(red_sum + kWgRows * t.warp + 8 * j + 2 * q) =
          make_float2(l_run[2 * j], l_run[2 * j + 1]);
  }
  wg_barrier(t.wg);
  const int dim0 = 16 * t.warp + 2 * m;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int n = 8 * (r >> 1) + 2 * q + (r & 1);
    int row = w.row0 + kWgRows * t.wg + n;
    asm volatile("" : "+r"(row));  // the row's token index divided anew, not carried from make_frag
    if (row >= rows_total) continue;
    const float l = red_sum[n] + red_sum[kWgRows + n] + red_sum[2 * kWgRows + n] + red_sum[3 * kWgRows + n];
    const int64_t tok = q_start + row / w.H, head = row % w.H;
    if (t.warp == 0 && m == 0) {  // the LSE: every thread of the row holds its m_run
      const float lse2 = l > 0.f ? m_run[r] + log2f(l) : -INFINITY;
      if (p.num_splits > 1)
        p.partial_lse[(tok * w.H + head) * p.num_splits + w.split] = lse2;
      else if (p.lse != nullptr)
        p.lse[tok * w.H + head] = lse2 * 0.6931471805599453f;
    }
    const float inv = l > 0.f ? out_mul / l : 0.f;
    const int i = 4 * (r >> 1) + (r & 1);
    auto store = [&](auto* o) {
#pragma unroll
      for (int c = 0; c < 8; ++c) store2(o + dim0 + 64 * c, acc[c][i] * inv, acc[c][i + 2] * inv);
    };
    if (p.num_splits == 1)
      store(static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_t + head * p.out_stride_h);
    else
      store(p.partial_out + tok * p.po_stride_t + head * p.po_stride_h + w.split * p.po_stride_s);
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
  // full: the stage landed (TMA bytes); empty: both warpgroups' S and P V fragments are done with it (every
  // consumer thread arrives once).
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

  // ---- consumers: warpgroup g owns query rows 32g .. 32g + 31 ----
  setmaxnreg_inc<kMmaRegs>();
  const Frag f = make_frag(w);
  const RowSplit t{f.wg, (f.tid % 128) / 32, f.lane};
  int* limit = reinterpret_cast<int*>(smem + kLimit);
  if (w.n_tiles > 0) {
    quantize_q_latent(p, w, f, smem + kQ, reinterpret_cast<float*>(smem + kQScale));
    load_q_tile<8>(p, w, f, smem + kQRope, 512);  // Q's rope stays bf16
    fence_proxy_async();
    if (f.tid < kRows) limit[f.tid] = min(w.end, w.kv_len - w.q_len + (w.row0 + f.tid) / w.H + 1);
  }
  named_barrier_sync(1, kConsumerThreads);
  stamp(p, kPhaseQLoaded, f.tid == 0);

  WaitCycles full_waits, building;
  float acc[8][16];  // O^T: M-chunk c of the 512 latent dims
#pragma unroll
  for (int c = 0; c < 8; ++c)
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[c][i] = 0.f;
  float m_run[8], l_run[8], c_prev = 1.f;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    m_run[r] = -INFINITY;
    l_run[r] = 0.f;
  }
  const uint32_t q_lat = base + kQ + t.wg * kWgRows * 128, q_rope = base + kQRope + t.wg * kWgRows * 128;
  const uint32_t p_base = base + kP + t.wg * kPBytes;
  float* red_scale = reinterpret_cast<float*>(smem + kRedScale) + 4 * t.wg;
  float* red_max = reinterpret_cast<float*>(smem + kRedMax) + 4 * kWgRows * t.wg;
  // Serial within a warpgroup (S, softmax, fragments, P V: the accumulator, the fragments and S do not fit in
  // registers together); the overlap is the other warpgroup's. No MMA is in flight across the loop's back edge
  // (ptxas serialises every wgmma of a kernel whose in-flight accumulators it cannot keep in place: C7515).
  for (int it = 0; it < w.n_tiles; ++it) {
    const int stage = it % kRing, key0 = w.start + it * kKeys;
    const uint32_t st_base = base + kStage0 + stage * kStageBytes;
    full_waits.start();
    mbar_wait(full_bar + 8 * stage, (it / kRing) & 1);
    full_waits.stop();
    stamp(p, kPhaseFirstTile, f.tid == 0 && it == 0);
    float s_lat0[16], s_lat1[16], s_rope[16], rescale[8];
    issue_st_e4m3(s_lat0, s_lat1, s_rope, q_lat, q_rope, st_base);
    wgmma_wait_all();
    fence_regs(s_lat0);
    fence_regs(s_lat1);
    fence_regs(s_rope);
    const bool moved = softmax_tile_t(
        s_lat0, s_lat1, s_rope, reinterpret_cast<const float*>(smem + kScales) + stage * kKeys, key0, w.end - key0,
        limit + kWgRows * t.wg, reinterpret_cast<const float*>(smem + kQScale) + kWgRows * t.wg, p.scale_log2,
        red_scale, red_max, smem + kP + t.wg * kPBytes, t, m_run, l_run, rescale, c_prev);
    if (moved) {  // skipped when no row's max and no c moved: most tiles once a long context's max settles
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[c][i] *= rescale[2 * (i >> 2) + (i & 1)];
    }
    building.start();
    uint32_t a[8][2][4];  // this warp's P V fragments of the tile
    load_v_frags(st_base, w.end - key0, t.warp, t.lane, a);
    building.stop();
    mbar_arrive(empty_bar + 8 * stage);
    stamp(p, kPhaseLastVt, f.tid == 0 && it == w.n_tiles - 1);
    fence_proxy_async();  // P before wgmma reads it
    wg_barrier(t.wg);
    issue_pv_e4m3(acc, a, p_base);
    wgmma_wait_all();
#pragma unroll
    for (int c = 0; c < 8; ++c) fence_regs(acc[c]);
  }
  stamp(p, kPhaseLastPv, f.tid == 0 && w.n_tiles > 0);
  write_out_t(p, w, t, acc, m_run, l_run, reinterpret_cast<float*>(smem + kRedSum) + 4 * kWgRows * t.wg,
              1.f / c_prev);
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
