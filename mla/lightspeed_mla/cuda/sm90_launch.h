// Between the kernel files and the dispatcher (mla_decode_sm90.cu): each kernel file opts its kernels in to
// their shared memory and launches them; the dispatcher builds the tensor maps and checks the launch.
#pragma once

#include <cudaTypedefs.h>

#include <cstdio>
#include <utility>

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

// `kernel` over `grid` on `stream`, with the programmatic-stream-serialization attribute when `pdl` (the kernel
// then starts with grid_dependency_enter); 0 or the launch's error, with a message in err.
template <typename... Params, typename... Args>
int launch_kernel(void (*kernel)(Params...), dim3 grid, int threads, int smem_bytes, cudaStream_t stream, bool pdl,
                  char* err, int errlen, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) set_err(err, errlen, cudaGetErrorString(e), static_cast<int>(e));
  return static_cast<int>(e);
}

// Each launches over `grid` after the opt-in (nothing when the batch or its row tiles are empty), with PDL
// when a.pdl, and returns 0 or the opt-in's or the launch's error.
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
