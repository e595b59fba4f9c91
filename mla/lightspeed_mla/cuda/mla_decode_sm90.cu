// The host side of the sm_90a MLA decode kernels: tensor maps over the cache, the page-size check, which
// kernel runs (the kernels and their launchers: mla_decode_sm90_bf16.cu, mla_decode_sm90_fp8mma.cu; their
// design: sm90_decode_common.cuh).

#include "sm90_decode_common.cuh"
#include "sm90_launch.h"

namespace lightspeed_mla {
namespace {

using sm90_launch::set_err;

#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
__global__ void globaltimer_mark_kernel(uint64_t* out_ns) { *out_ns = globaltimer_ns(); }
#endif

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

}  // namespace

int mla_sm90_smem_bytes() { return sm90_launch::bf16_smem_bytes(); }
int mla_sm90_fp8_smem_bytes(bool fp8_scores, bool fp8_pv) {
  return fp8_scores && fp8_pv ? sm90_launch::fp8mma_smem_bytes() : sm90_launch::fp8_smem_bytes(fp8_scores);
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
  int rc = 0;
  if (!a.fp8) {
    CUtensorMap map;
    if (!encode_map(encode, &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.kv, kDim, a.kv_num_tokens,
                    a.kv_stride_token * 2, 64, box_rows, err, errlen))
      return -1;
    rc = sm90_launch::bf16(map, a, grid, stream, err, errlen);
  } else {
    CUtensorMap lat, rope;
    if (!encode_map(encode, &lat, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.kv, 512, a.kv_num_tokens, a.kv_stride_token,
                    128, box_rows, err, errlen) ||
        !encode_map(encode, &rope, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.rope, 64, a.kv_num_tokens,
                    a.rope_stride_token * 2, 64, box_rows, err, errlen))
      return -1;
    rc = a.fp8_scores && a.fp8_pv ? sm90_launch::fp8mma(lat, rope, a, grid, stream, err, errlen)
                                  : sm90_launch::fp8(lat, rope, a, grid, stream, err, errlen);
  }
  if (rc != 0) return rc;
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
