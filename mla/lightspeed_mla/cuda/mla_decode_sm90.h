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
  bool fp8_pv;               // with fp8_scores: P V on e4m3 MMAs too (P quantised per tile, V^T as the
                             // register operand) instead of bf16 MMAs on the widened latent
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
#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
  // [CTAs, kTimerSlots]: %globaltimer ns of each MlaPhase, then the MlaCounter cycles; or nullptr; CTA = (blockIdx.z * row_tiles + blockIdx.y) * num_splits
  // + blockIdx.x. Only in the instrumented build, so the production kernel's parameters stay as they were
  // (binding.cpp is compiled with the same define: both sides see one layout).
  uint64_t* phase_ns;
#endif
};

// Phase timers (a build with -DLIGHTSPEED_MLA_PHASE_TIMERS): the boundaries each CTA stamps, in about
// the order they happen. sm90.PHASES names them in this order (a CPU test keeps the two in step).
// A stamp is the %globaltimer (ns) when the named thread got there; CTAs with no rows stamp only
// kEntry, CTAs with no keys stamp no tile phases (those stay 0).
enum MlaPhase : int {
  kPhaseEntry,       // thread 0, the kernel's first instruction
  kPhaseWork,        // thread 0, after cta_work's reads of query_start / seq_lens
  kPhaseFirstTma,    // producer lane: tile 0's boxes issued (so its page ids have been read)
  kPhaseLastTma,     // producer lane: the last tile's boxes issued
  kPhaseQLoaded,     // consumer thread 0: the query tile in shared memory (past the consumers' barrier)
  kPhaseFirstTile,   // consumer thread 0: tile 0 landed (its full barrier's wait returned)
  kPhaseLastVt,      // fp8mma only: consumer thread 0: its V^T fragments of the last tile built (P V's A)
  kPhaseLastPv,      // consumer thread 0: the last tile's P V done (warpgroup 0's wgmma wait)
  kPhaseEpilogue,    // consumer thread 0: write_out's stores issued
  kNumPhases
};

// Cycle counters of the timer build, after the stamps in each CTA's row of phase_ns (column kNumPhases +
// counter): one thread of a role sums the %clock64 cycles it spent in a wait (or building the fp8mma
// P V fragments), so the per-tile rate shows which side of the ring is short; thread 0's %clock64 at
// entry and after the epilogue give, with kPhaseEntry / kPhaseEpilogue's ns, the cycles' rate. Counters of
// a role a kernel lacks stay 0. sm90.COUNTERS names them in this order.
enum MlaCounter : int {
  kCountConsumerWaitFull,    // consumer thread 0: waiting for tiles to land (full barriers)
  kCountConsumerTranspose,   // fp8mma, consumer thread 0: building its P V fragments of V^T
  kCountProducerWaitEmpty,   // producer lane: waiting for a free stage (empty barriers)
  kCountClockEntry,          // thread 0: %clock64 at entry
  kCountClockEpilogue,       // consumer thread 0: %clock64 after write_out
  kNumCounters
};
constexpr int kTimerSlots = kNumPhases + kNumCounters;  // int64 per CTA in phase_ns

// Shared memory the bf16 / FP8 kernels ask for (bytes), for the record.
int mla_sm90_smem_bytes();
int mla_sm90_fp8_smem_bytes(bool fp8_scores, bool fp8_pv);

// Launch on `stream`. Returns 0, or a CUDA error code with a message in err (errlen bytes).
int mla_sm90_decode_launch(const MlaSm90Args& args, cudaStream_t stream, char* err, int errlen);

#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
// One thread writes %globaltimer to *out_ns: launched before and after a decode on the same stream, it
// brackets the kernel's launch and teardown, which no stamp inside the kernel can see.
int mla_sm90_globaltimer_mark(uint64_t* out_ns, cudaStream_t stream);
#endif

}  // namespace lightspeed_mla
