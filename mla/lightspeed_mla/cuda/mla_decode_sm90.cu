// Absorbed MLA decode for sm_90a: TMA page loads into a shared-memory ring, one producer lane, two
// consumer warpgroups running wgmma, online softmax, split-KV partials for the Triton combine.
//
// Design note. A CTA owns 64 rows of one request (rows = (query token, head) pairs, row =
// token * H + head, so 16 heads x 4 speculative tokens fill one tile) and one split of its keys.
//   warpgroup 2 (producer; one lane): for each 64-key tile, reads the page ids from the page table and issues one
//     TMA box per (page piece, 64-column block): 9 boxes of [rows, 64] cover the 576-wide rows, each
//     landing 128B-swizzled, the layout wgmma reads. A 2-stage ring with full / empty mbarriers.
//   warpgroups 0 and 1 (consumers): warpgroup g computes S = Q K^T for keys 32g..32g+31 of the tile
//     (m64n32k16, K = 576: Q and K both from shared memory), the two exchange row maxima through
//     shared memory, each writes its half of P (bf16) to shared memory, and then warpgroup g runs
//     P V for latent columns 256g..256g+255 (m64n256k16, V = the same latent tile read MN-major).
//     So every MMA is done once, S and P V are split evenly, and the 64x512 fp32 accumulator is
//     128 registers a thread.
// Shared memory: Q 72 KB + 2 x 72 KB KV stages + P 8 KB = 224 KB: one CTA per SM; the split count
// fills one wave (choose_num_splits). Keys past the split's end inside the last tile are masked in S
// and their V rows zeroed (a page's tail past the request may hold anything, NaN included).
// Page sizes 8..256 (powers of two): a tile is one page piece of min(page_size, 64) tokens or several.

#include "mla_decode_sm90.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <cstdio>

namespace lightspeed_mla {
namespace {

constexpr int kRows = 64;          // query rows per CTA (one wgmma M)
constexpr int kKeys = 64;          // keys per tile
constexpr int kStages = 2;
constexpr int kDim = 576;          // latent 512 + rope 64
constexpr int kColBlocks = kDim / 64;            // 9 blocks of 64 columns (128 B, one swizzle row)
constexpr int kBlockBytes = kKeys * 128;         // one [64 rows x 64 cols] bf16 block: 8 KB
constexpr int kTileBytes = kColBlocks * kBlockBytes;  // 72 KB: a Q tile or a KV tile
constexpr int kQOff = 0;
constexpr int kKVOff = kQOff + kTileBytes;
constexpr int kPOff = kKVOff + kStages * kTileBytes;
constexpr int kRedMaxOff = kPOff + kRows * 128;  // float [2][64]
constexpr int kRedSumOff = kRedMaxOff + 2 * kRows * 4;
constexpr int kBarOff = kRedSumOff + 2 * kRows * 4;  // uint64 full[2], empty[2]
constexpr int kSmemUsed = kBarOff + 2 * kStages * 8;
constexpr int kSmemBytes = kSmemUsed + 1024;     // slack to align the base to 1024 B (swizzle atoms)
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup (one lane issues)
// Registers are handed out per warpgroup: 384 threads get 168 each at launch; the producer gives
// most of its share back so the consumers' 128-register accumulators fit (3 x 128 x ... <= 64K).
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536, "register file");
static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LIGHTSPEED_SM90A 1
#endif

// ---- PTX wrappers (sm_90a) ----------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// One 2D TMA box [rows, 64 columns] of the cache into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int col, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Generic-proxy writes to shared memory (Q, P, zeroed rows) before the async proxy (wgmma) reads.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Keeps the compiler from moving accumulator reads / writes across the asynchronous MMAs.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// wgmma shared-memory descriptor, 128B swizzle. K-major tiles: rows of 128 B, 8-row groups 1024 B
// apart (SBO), LBO unused (1). MN-major tiles (V read as [keys, columns]): 64-column blocks `lbo`
// bytes apart, 8-key groups 1024 B apart.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>(lbo_bytes >> 4) << 16;
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;  // 128B swizzle
  return desc;
}

// D[64 x 32] (+)= A[64 x 16] * B[16 x 32], A and B from shared memory (both K-major).
__device__ __forceinline__ void wgmma_m64n32_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 256] (+)= A[64 x 16] * B[16 x 256], A and B from shared memory (B MN-major).
__device__ __forceinline__ void wgmma_m64n256_ss_tb(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}


// Byte offset of element (row, col) in a [64, 64-col blocks] tile stored as 128B-swizzled blocks.
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col) {
  const int chunk = (col & 63) >> 3;
  return (col >> 6) * kBlockBytes + row * 128 + ((chunk ^ (row & 7)) << 4) + (col & 7) * 2;
}

__device__ __forceinline__ float warp_max4(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}

__device__ __forceinline__ float warp_sum4(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  return v + __shfl_xor_sync(0xffffffff, v, 2);
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_kernel(const __grid_constant__ CUtensorMap kv_map, const MlaSm90Args p) {
#ifdef LIGHTSPEED_SM90A
  const int split = blockIdx.x, tile_m = blockIdx.y, b = blockIdx.z;
  const int H = p.num_heads;
  const int q_start = p.query_start[b];
  const int q_len = p.query_start[b + 1] - q_start;
  const int kv_len = p.seq_lens[b];
  const int row0 = tile_m * kRows;
  const int rows_total = q_len * H;
  if (row0 >= rows_total) return;  // the whole CTA: no barrier has been touched

  // Keys this CTA covers: split `split` of the request, cut at the causal end of its last row.
  const int last_q = min((row0 + kRows - 1) / H, q_len - 1);
  const int tile_end = kv_len - q_len + last_q + 1;
  const int per_split = ((kv_len + p.num_splits - 1) / p.num_splits + kKeys - 1) / kKeys * kKeys;
  const int start = split * per_split;
  const int end = min(start + per_split, tile_end);
  const int n_tiles = end > start ? (end - start + kKeys - 1) / kKeys : 0;

  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t pad = ((raw + 1023) & ~1023u) - raw;
  uint8_t* smem = smem_raw + pad;
  const uint32_t base = raw + pad;
  const uint32_t full_bar = base + kBarOff, empty_bar = full_bar + kStages * 8;
  float* red_max = reinterpret_cast<float*>(smem + kRedMaxOff);
  float* red_sum = reinterpret_cast<float*>(smem + kRedSumOff);

  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, kConsumerThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (tid >= kConsumerThreads) {
    // ---- producer warpgroup: one lane issues every TMA ----
    setmaxnreg_dec<kProducerRegs>();
    if (tid == kConsumerThreads) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&kv_map)) : "memory");
      const int box_rows = min(p.page_size, kKeys);
      const int boxes = kKeys / box_rows;
      const int last_page = (kv_len - 1) / p.page_size;
      const int32_t* pt = p.page_table + static_cast<int64_t>(b) * p.page_table_stride;
      for (int i = 0; i < n_tiles; ++i) {
        const int stage = i % kStages;
        if (i >= kStages) mbar_wait(empty_bar + 8 * stage, ((i / kStages) - 1) & 1);
        const uint32_t bar = full_bar + 8 * stage;
        mbar_expect_tx(bar, kTileBytes);
        const uint32_t dst = base + kKVOff + stage * kTileBytes;
        const int key0 = start + i * kKeys;
        for (int j = 0; j < boxes; ++j) {
          const int key = key0 + j * box_rows;
          // Pieces past the request's last page re-read its last page: finite data, masked below.
          const int page = pt[min(key / p.page_size, last_page)];
          const int row = page * p.page_size + (key & (p.page_size - 1));
#pragma unroll
          for (int c = 0; c < kColBlocks; ++c)
            tma_load_2d(dst + c * kBlockBytes + j * box_rows * 128, &kv_map, c * 64, row, bar);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kConsumerRegs>();
  const int wg = tid / 128;          // warpgroup: S keys 32wg.., P V columns 256wg..
  const int warp = (tid % 128) / 32;  // rows 16warp.. of the wgmma M tile
  const int lane = tid % 32;
  const int r_lo = 16 * warp + lane / 4, r_hi = r_lo + 8;  // the two rows this thread holds

  // Q -> shared memory, 128B-swizzled blocks; rows past the request's are zeros.
  if (n_tiles > 0) {
    for (int v = tid; v < kRows * (kDim / 8); v += kConsumerThreads) {
      const int r = v / (kDim / 8), c8 = v % (kDim / 8);
      uint4 val = make_uint4(0, 0, 0, 0);
      const int row = row0 + r;
      if (row < rows_total) {
        const int tok = q_start + row / H, head = row % H;
        const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(p.q) + tok * p.q_stride_t +
                                   head * p.q_stride_h + c8 * 8;
        val = *reinterpret_cast<const uint4*>(src);
      }
      *reinterpret_cast<uint4*>(smem + kQOff + swizzled_offset(r, c8 * 8)) = val;
    }
    fence_proxy_async();
  }
  named_barrier_sync(1, kConsumerThreads);

  // Causal limit of each held row: query i of the request sees keys < kv_len - q_len + i + 1.
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + (h ? r_hi : r_lo);
    limit[h] = min(end, kv_len - q_len + row / H + 1);
  }

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const uint32_t q_base = base + kQOff, p_base = base + kPOff;

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it % kStages;
    const uint32_t kv_base = base + kKVOff + stage * kTileBytes;
    const int key0 = start + it * kKeys;
    mbar_wait(full_bar + 8 * stage, (it / kStages) & 1);

    // S[64 rows, 32 keys] = Q K^T over the 576 columns: 36 k-steps of 16.
    float s[16];
    fence_regs(s);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDim / 16; ++k) {
      const uint32_t koff = (k >> 2) * kBlockBytes + (k & 3) * 32;
      wgmma_m64n32_ss(s, smem_desc(q_base + koff, 16), smem_desc(kv_base + wg * 32 * 128 + koff, 16), k > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(s);

    // Mask and scale (log2 domain); fragment element i: row (i>>1)&1 ? r_hi : r_lo,
    // key 8*(i>>2) + 2*(lane&3) + (i&1) of this warpgroup's 32.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int h = (i >> 1) & 1;
      const int key = key0 + 32 * wg + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
      s[i] = key < limit[h] ? s[i] * p.scale_log2 : -INFINITY;
      mx[h] = fmaxf(mx[h], s[i]);
    }
    mx[0] = warp_max4(mx[0]);
    mx[1] = warp_max4(mx[1]);
    if ((lane & 3) == 0) {
      red_max[wg * kRows + r_lo] = mx[0];
      red_max[wg * kRows + r_hi] = mx[1];
    }
    named_barrier_sync(1, kConsumerThreads);
    float m_use[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = h ? r_hi : r_lo;
      const float m_new = fmaxf(m_run[h], fmaxf(red_max[r], red_max[kRows + r]));
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = exp2f(m_run[h] - m_use[h]);
      m_run[h] = m_new;
    }
    float psum[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int h = (i >> 1) & 1;
      const float p0 = exp2f(s[i] - m_use[h]), p1 = exp2f(s[i + 1] - m_use[h]);
      psum[h] += p0 + p1;
      const int r = h ? r_hi : r_lo;
      const int key = 32 * wg + 8 * (i >> 2) + 2 * (lane & 3);
      *reinterpret_cast<__nv_bfloat162*>(smem + kPOff + swizzled_offset(r, key)) = __floats2bfloat162_rn(p0, p1);
    }
    l_run[0] = l_run[0] * alpha[0] + psum[0];
    l_run[1] = l_run[1] * alpha[1] + psum[1];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] *= alpha[(i >> 1) & 1];

    // Keys past `end` in this tile: zero this warpgroup's V rows (P is 0 there, but 0 * NaN is not).
    const int valid = end - key0;
    if (valid < kKeys) {
      const int t = tid % 128;
      for (int v = t; v < (kKeys - valid) * 4 * 8; v += 128) {
        const int r = valid + v / 32, blk = 4 * wg + (v / 8) % 4, c16 = v % 8;
        *reinterpret_cast<uint4*>(smem + kKVOff + stage * kTileBytes + blk * kBlockBytes + r * 128 + c16 * 16) =
            make_uint4(0, 0, 0, 0);
      }
    }
    fence_proxy_async();
    named_barrier_sync(1, kConsumerThreads);

    // O[64 rows, 256 columns] += P[64, 64 keys] V[64 keys, 256]: 4 k-steps of 16 keys.
    fence_regs(acc);  // the rescaled accumulator is written before the fence
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kKeys / 16; ++k) {
      const uint64_t da = smem_desc(p_base + k * 32, 16);
      const uint64_t db = smem_desc(kv_base + 4 * wg * kBlockBytes + k * 16 * 128, kBlockBytes);
      wgmma_m64n256_ss_tb(acc, da, db, 1);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_regs(acc);
    mbar_arrive(empty_bar + 8 * stage);
  }

  // Row sums: 4 lanes a row, then the two warpgroups' key halves.
#pragma unroll
  for (int h = 0; h < 2; ++h) l_run[h] = warp_sum4(l_run[h]);
  if ((lane & 3) == 0) {
    red_sum[wg * kRows + r_lo] = l_run[0];
    red_sum[wg * kRows + r_hi] = l_run[1];
  }
  named_barrier_sync(1, kConsumerThreads);
  float inv[2], lse2[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? r_hi : r_lo;
    const float l = red_sum[r] + red_sum[kRows + r];
    inv[h] = l > 0.f ? 1.f / l : 0.f;
    lse2[h] = l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
  }

  // Write: the output (one split) or this split's normalised partial and its log2-LSE.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + (h ? r_hi : r_lo);
    if (row >= rows_total) continue;
    const int64_t tok = q_start + row / H, head = row % H;
    const int col0 = 256 * wg + 2 * (lane & 3);
    if (p.num_splits == 1) {
      __nv_bfloat16* o = static_cast<__nv_bfloat16*>(p.out) + tok * p.out_stride_t + head * p.out_stride_h;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int i = 4 * j + 2 * h;
        *reinterpret_cast<__nv_bfloat162*>(o + col0 + 8 * j) =
            __floats2bfloat162_rn(acc[i] * inv[h], acc[i + 1] * inv[h]);
      }
      if (p.lse != nullptr && wg == 0 && (lane & 3) == 0) p.lse[tok * H + head] = lse2[h] * 0.6931471805599453f;
    } else {
      float* o = p.partial_out + tok * p.po_stride_t + head * p.po_stride_h + split * p.po_stride_s;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int i = 4 * j + 2 * h;
        *reinterpret_cast<float2*>(o + col0 + 8 * j) = make_float2(acc[i] * inv[h], acc[i + 1] * inv[h]);
      }
      if (wg == 0 && (lane & 3) == 0) p.partial_lse[(tok * H + head) * p.num_splits + split] = lse2[h];
    }
  }
#endif  // LIGHTSPEED_SM90A
}

void set_err(char* err, int errlen, const char* msg, int code) {
  if (err != nullptr && errlen > 0) snprintf(err, errlen, "%s (%d)", msg, code);
}

}  // namespace

int mla_sm90_smem_bytes() { return kSmemBytes; }

int mla_sm90_decode_launch(const MlaSm90Args& a, cudaStream_t stream, char* err, int errlen) {
  // The cuTensorMapEncodeTiled driver entry point, looked up once through the runtime (no -lcuda).
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      set_err(err, errlen, "cuTensorMapEncodeTiled not found", static_cast<int>(e));
      return e != cudaSuccess ? static_cast<int>(e) : -1;
    }
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  if (a.page_size < 8 || a.page_size > 256 || (a.page_size & (a.page_size - 1)) != 0) {
    set_err(err, errlen, "page_size must be a power of two in 8..256", a.page_size);
    return -1;
  }
  // The cache as a 2D tensor [tokens, 576] with a 16-byte-multiple token stride; boxes of
  // [min(page_size, 64) tokens, 64 columns], 128B-swizzled (one 128-byte row a token per box).
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kDim), static_cast<cuuint64_t>(a.kv_num_tokens)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.kv_stride_token) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(a.page_size < kKeys ? a.page_size : kKeys)};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(a.kv), dims, strides, box,
                      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    set_err(err, errlen, "cuTensorMapEncodeTiled failed", static_cast<int>(r));
    return -1;
  }
  // The shared-memory opt-in is per device: remembered in a bit per device ordinal.
  static unsigned long long attr_set = 0;
  int device = 0;
  cudaGetDevice(&device);
  if (device >= 64 || !(attr_set >> device & 1ull)) {
    cudaError_t e = cudaFuncSetAttribute(mla_decode_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (e != cudaSuccess) {
      set_err(err, errlen, cudaGetErrorString(e), static_cast<int>(e));
      return static_cast<int>(e);
    }
    if (device < 64) attr_set |= 1ull << device;
  }
  if (a.batch == 0 || a.row_tiles == 0) return 0;
  dim3 grid(a.num_splits, a.row_tiles, a.batch);
  mla_decode_sm90_kernel<<<grid, kThreads, kSmemBytes, stream>>>(map, a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    set_err(err, errlen, cudaGetErrorString(e), static_cast<int>(e));
    return static_cast<int>(e);
  }
  return 0;
}

}  // namespace lightspeed_mla
