// Absorbed MLA decode for sm_90a (Hopper): the launcher's interface. No torch here, so the kernel
// file compiles standalone (nvcc -arch=sm_90a -c mla_decode_sm90.cu); binding.cpp is the torch side.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace lightspeed_mla {

// One batch of absorbed attention over a paged MLA cache: bf16 (one packed [pages, page_size, 576]
// tensor) or FP8 (e4m3 latent [pages, page_size, 512] + one fp32 scale a token + bf16 rope
// [pages, page_size, 64], three tensors).
// Rows of a request are its (query token, head) pairs, row = token * num_heads + head; a CTA takes
// 64 of them (a row tile) for one split of the keys. Strides are in elements.
struct MlaSm90Args {
  const void* q;             // [T, H, 576] bf16, unit last stride
  int64_t q_stride_t, q_stride_h;
  const void* kv;            // bf16: packed cache base [pages, page_size, 576]; fp8: the e4m3 latent
  int64_t kv_num_tokens;     // pages * page_size
  int64_t kv_stride_token;   // elements between tokens (576 packed, 512 for the e4m3 latent), page-flat
  bool fp8;                  // the FP8 cache: rope and scale below are read too
  const void* rope;          // fp8 only: bf16 [pages, page_size, 64], page-flat
  int64_t rope_stride_token; // elements
  const float* scale;        // fp8 only: fp32 [pages * page_size] (latent = e4m3 * scale), contiguous
  bool fp8_scores;           // fp8 only: S_latent on e4m3 MMAs with Q quantised per row (faster, ~3% error
                             // on random data) instead of bf16 MMAs on the widened latent
  const int32_t* page_table; // [B, max_pages]
  int64_t page_table_stride;
  const int32_t* seq_lens;   // [B] keys per request (device: the true lengths of this step)
  const int32_t* query_start;// [B+1]
  void* out;                 // [T, H, 512] bf16 (written when num_splits == 1)
  int64_t out_stride_t, out_stride_h;
  float* lse;                // [T, H] natural-log LSE, contiguous, or nullptr (num_splits == 1 only)
  float* partial_out;        // [T, H, S, 512] fp32 (num_splits > 1), normalised per split
  int64_t po_stride_t, po_stride_h, po_stride_s;
  float* partial_lse;        // [T, H, S] fp32 contiguous, log2 domain
  int batch, num_heads, row_tiles, num_splits, page_size;
  float scale_log2;          // softmax_scale * log2(e)
};

// Shared memory the bf16 / FP8 kernels ask for (bytes), for the record.
int mla_sm90_smem_bytes();
int mla_sm90_fp8_smem_bytes(bool fp8_scores);

// Launch on `stream`. Returns 0, or a CUDA error code with a message in err (errlen bytes).
int mla_sm90_decode_launch(const MlaSm90Args& args, cudaStream_t stream, char* err, int errlen);

}  // namespace lightspeed_mla
