// Between the kernel files and the dispatcher (mla_decode_sm90.cu): each kernel file opts its kernels in to
// their shared memory and launches them; the dispatcher builds the tensor maps and checks the launch.
#pragma once

#include <cudaTypedefs.h>

#include <cstdio>

#include "mla_decode_sm90.h"

namespace lightspeed_mla {
namespace sm90_launch {

inline void set_err(char* err, int errlen, const char* msg, int code) {
  if (err != nullptr && errlen > 0) snprintf(err, errlen, "%s (%d)", msg, code);
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

// Each launches over `grid` after the opt-in (nothing when the batch or its row tiles are empty) and
// returns 0 or the opt-in's error; the dispatcher checks the launch itself.
int bf16(const CUtensorMap& kv, const MlaSm90Args& a, dim3 grid, cudaStream_t stream, char* err, int errlen);
// a.fp8_scores: S_latent on e4m3 MMAs (Q quantised), else bf16 on the widened latent.
int fp8(const CUtensorMap& lat, const CUtensorMap& rope, const MlaSm90Args& a, dim3 grid, cudaStream_t stream,
        char* err, int errlen);
int fp8mma(const CUtensorMap& lat, const CUtensorMap& rope, const MlaSm90Args& a, dim3 grid, cudaStream_t stream,
           char* err, int errlen);
int bf16_smem_bytes();
int fp8_smem_bytes(bool fp8_scores);
int fp8mma_smem_bytes();

}  // namespace sm90_launch
}  // namespace lightspeed_mla
