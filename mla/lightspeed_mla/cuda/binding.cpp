// Torch binding of the sm_90a MLA decode kernel (mla_decode_sm90.cu): checks devices, dtypes and
// layouts, fills MlaSm90Args and launches on the current stream. No allocation, no host sync, so a
// CUDA graph captures it; the shapes and strides come from lightspeed_mla/sm90.py's plan.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "mla_decode_sm90.h"

namespace {

void check_cuda(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), "mla_decode_sm90: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, "mla_decode_sm90: ", name, " has dtype ", t.scalar_type(), ", want ", dtype);
}

// kv: the bf16 packed cache [pages, page_size, 576], or (with rope and scale given) the FP8 cache's
// e4m3 latent [pages, page_size, 512]; rope: bf16 [pages, page_size, 64]; scale: fp32 [pages, page_size, 1].
// phase_ns: int64 [batch * row_tiles * num_splits, kTimerSlots] for the phase stamps and cycle counters, zero-filled by the
// caller; accepted by the build with LIGHTSPEED_MLA_PHASE_TIMERS only (the production one refuses it), so
// both builds keep one signature.
void decode(const at::Tensor& q, const at::Tensor& kv, c10::optional<at::Tensor> rope, c10::optional<at::Tensor> scale,
            const at::Tensor& page_table, const at::Tensor& seq_lens, const at::Tensor& query_start, at::Tensor out,
            c10::optional<at::Tensor> lse, c10::optional<at::Tensor> partial_out,
            c10::optional<at::Tensor> partial_lse, int64_t batch, int64_t row_tiles, int64_t num_splits,
            double scale_log2, bool fp8_scores, bool fp8_pv, c10::optional<at::Tensor> phase_ns) {
  check_cuda(q, "q", at::kBFloat16);
  const bool fp8 = rope.has_value();
  TORCH_CHECK(fp8 == scale.has_value(), "mla_decode_sm90: rope and scale come together (the FP8 cache)");
  TORCH_CHECK(!fp8_pv || (fp8 && fp8_scores), "mla_decode_sm90: fp8_pv (e4m3 P V) needs the FP8 cache and fp8_scores");
  check_cuda(kv, "kv", fp8 ? at::kFloat8_e4m3fn : at::kBFloat16);
  const int64_t width = fp8 ? 512 : 576, align = fp8 ? 16 : 8;  // a token row: 16-byte multiple
  TORCH_CHECK(kv.dim() == 3 && kv.size(2) == width && kv.stride(2) == 1 && kv.stride(1) % align == 0 &&
                  kv.stride(0) == kv.size(1) * kv.stride(1) && reinterpret_cast<uintptr_t>(kv.data_ptr()) % 16 == 0,
              "mla_decode_sm90: kv must be a page-flat [pages, page_size, ", width, "] tensor, 16-byte aligned rows");
  if (fp8) {
    check_cuda(*rope, "rope", at::kBFloat16);
    check_cuda(*scale, "scale", at::kFloat);
    TORCH_CHECK(rope->dim() == 3 && rope->size(0) == kv.size(0) && rope->size(1) == kv.size(1) && rope->size(2) == 64 &&
                    rope->stride(2) == 1 && rope->stride(1) % 8 == 0 && rope->stride(0) == rope->size(1) * rope->stride(1) &&
                    reinterpret_cast<uintptr_t>(rope->data_ptr()) % 16 == 0,
                "mla_decode_sm90: rope must be a page-flat [pages, page_size, 64] tensor, 16-byte aligned rows");
    TORCH_CHECK(scale->is_contiguous() && scale->numel() == kv.size(0) * kv.size(1) &&
                    reinterpret_cast<uintptr_t>(scale->data_ptr()) % 16 == 0,
                "mla_decode_sm90: scale must be contiguous [pages, page_size, 1]");
  }
  check_cuda(page_table, "page_table", at::kInt);
  check_cuda(seq_lens, "seq_lens", at::kInt);
  check_cuda(query_start, "query_start", at::kInt);
  check_cuda(out, "out", at::kBFloat16);
  TORCH_CHECK(q.dim() == 3 && q.size(2) == 576 && q.stride(2) == 1, "mla_decode_sm90: q must be [T, H, 576]");
  TORCH_CHECK(q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 && reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0,
              "mla_decode_sm90: q rows must be 16-byte aligned");
  TORCH_CHECK(page_table.dim() == 2 && page_table.stride(1) == 1, "mla_decode_sm90: page_table must be [B, P]");
  TORCH_CHECK(out.dim() == 3 && out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == 512 &&
                  out.stride(2) == 1 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0,
              "mla_decode_sm90: out must be [T, H, 512]");
  TORCH_CHECK(num_splits >= 1 && row_tiles >= 0 && batch >= 0 && batch <= 65535 && row_tiles <= 65535,
              "mla_decode_sm90: bad grid");
  const c10::cuda::CUDAGuard guard(q.device());
  lightspeed_mla::MlaSm90Args a{};
  a.q = q.data_ptr();
  a.q_stride_t = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.kv = kv.data_ptr();
  a.kv_num_tokens = kv.size(0) * kv.size(1);
  a.kv_stride_token = kv.stride(1);
  a.fp8 = fp8;
  if (fp8) {
    a.rope = rope->data_ptr();
    a.rope_stride_token = rope->stride(1);
    a.scale = scale->data_ptr<float>();
    a.fp8_scores = fp8_scores;
    a.fp8_pv = fp8_pv;
  }
  a.page_table = page_table.data_ptr<int32_t>();
  a.page_table_stride = page_table.stride(0);
  a.seq_lens = seq_lens.data_ptr<int32_t>();
  a.query_start = query_start.data_ptr<int32_t>();
  a.out = out.data_ptr();
  a.out_stride_t = out.stride(0);
  a.out_stride_h = out.stride(1);
  a.batch = static_cast<int>(batch);
  a.num_heads = static_cast<int>(q.size(1));
  a.row_tiles = static_cast<int>(row_tiles);
  a.num_splits = static_cast<int>(num_splits);
  a.page_size = static_cast<int>(kv.size(1));
  a.scale_log2 = static_cast<float>(scale_log2);
  if (lse.has_value()) {
    check_cuda(*lse, "lse", at::kFloat);
    TORCH_CHECK(lse->is_contiguous() && lse->numel() == q.size(0) * q.size(1), "mla_decode_sm90: lse must be [T, H]");
    a.lse = lse->data_ptr<float>();
  }
  if (num_splits > 1) {
    TORCH_CHECK(partial_out.has_value() && partial_lse.has_value(), "mla_decode_sm90: splits need partial buffers");
    check_cuda(*partial_out, "partial_out", at::kFloat);
    check_cuda(*partial_lse, "partial_lse", at::kFloat);
    TORCH_CHECK(partial_out->dim() == 4 && partial_out->size(2) == num_splits && partial_out->stride(3) == 1 &&
                    partial_out->stride(0) % 2 == 0 && partial_out->stride(1) % 2 == 0 && partial_out->stride(2) % 2 == 0,
                "mla_decode_sm90: partial_out must be [T, H, S, 512]");
    TORCH_CHECK(partial_lse->is_contiguous() && partial_lse->numel() == q.size(0) * q.size(1) * num_splits,
                "mla_decode_sm90: partial_lse must be contiguous [T, H, S]");
    a.partial_out = partial_out->data_ptr<float>();
    a.po_stride_t = partial_out->stride(0);
    a.po_stride_h = partial_out->stride(1);
    a.po_stride_s = partial_out->stride(2);
    a.partial_lse = partial_lse->data_ptr<float>();
  }
  if (phase_ns.has_value()) {
#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
    check_cuda(*phase_ns, "phase_ns", at::kLong);
    TORCH_CHECK(phase_ns->is_contiguous() && phase_ns->numel() == batch * row_tiles * num_splits * lightspeed_mla::kTimerSlots,
                "mla_decode_sm90: phase_ns must be contiguous int64 [batch * row_tiles * num_splits, ",
                lightspeed_mla::kTimerSlots, "]");
    a.phase_ns = reinterpret_cast<uint64_t*>(phase_ns->data_ptr<int64_t>());
#else
    TORCH_CHECK(false, "mla_decode_sm90: phase_ns needs the build with phase timers (sm90.load_extension(phase_timers=True))");
#endif
  }
  char err[256] = {0};
  const int rc = lightspeed_mla::mla_sm90_decode_launch(a, c10::cuda::getCurrentCUDAStream().stream(), err, sizeof(err));
  TORCH_CHECK(rc == 0, "mla_decode_sm90: launch failed: ", err);
}

#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
// out_ns: one int64 element (CUDA) that gets %globaltimer when the stream reaches this point.
void globaltimer_mark(at::Tensor out_ns) {
  check_cuda(out_ns, "out_ns", at::kLong);
  TORCH_CHECK(out_ns.numel() >= 1, "globaltimer_mark: out_ns needs one element");
  const c10::cuda::CUDAGuard guard(out_ns.device());
  const int rc = lightspeed_mla::mla_sm90_globaltimer_mark(reinterpret_cast<uint64_t*>(out_ns.data_ptr<int64_t>()),
                                                           c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(rc == 0, "globaltimer_mark: launch failed (", rc, ")");
}
#endif

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode", &decode, "absorbed MLA decode, sm_90a (see lightspeed_mla/sm90.py)");
  m.def("smem_bytes", &lightspeed_mla::mla_sm90_smem_bytes, "dynamic shared memory per CTA, bf16 kernel");
  m.def("fp8_smem_bytes", &lightspeed_mla::mla_sm90_fp8_smem_bytes, "dynamic shared memory per CTA, FP8 kernels",
        pybind11::arg("fp8_scores"), pybind11::arg("fp8_pv") = false);
  m.attr("num_phases") = static_cast<int>(lightspeed_mla::kNumPhases);
  m.attr("num_counters") = static_cast<int>(lightspeed_mla::kNumCounters);
#ifdef LIGHTSPEED_MLA_PHASE_TIMERS
  m.def("globaltimer_mark", &globaltimer_mark, "write %globaltimer (ns) to out_ns[0] in stream order");
#endif
}
