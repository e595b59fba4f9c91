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

#include <cudaTypedefs.h>

#include "sm90_ptx.cuh"

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

using namespace sm90;

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
