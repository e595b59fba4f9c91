"""The accounting of tools/bench/profile_gpu.py and prefill_attention.py: GPU busy time is the union
of kernel intervals (streams overlap), kernels land in the category a reader expects, and prefill
FLOPs count only the pairs a bottom-right causal mask leaves visible."""

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import prefill_attention  # noqa: E402
import profile_gpu  # noqa: E402


def test_busy_time_is_the_union_of_overlapping_kernels():
    assert profile_gpu.busy_us([]) == 0.0
    assert profile_gpu.busy_us([(0, 10), (5, 12), (20, 25)]) == 17.0
    assert profile_gpu.busy_us([(20, 25), (0, 30)]) == 30.0  # one kernel inside another, unsorted


def test_kernel_categories():
    cat = profile_gpu.category
    assert cat("_prefill_kernel") == "attention"
    assert cat("_decode_kernel") == "attention" and cat("_combine_kernel") == "attention"
    assert cat("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT") == "gemm"
    assert cat("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert cat("_rms_norm_kernel") == "norm/rope/kv/act" and cat("_rope_kernel") == "norm/rope/kv/act"
    assert cat("_sample_kernel") == "sampling"
    assert cat("Memcpy DtoD (Device -> Device)") == "copy"
    assert cat("something_new") == "other"


def test_causal_flops_count_visible_pairs():
    # 2 new tokens over 3 cached: rows see 4 and 5 keys -> 9 pairs, 4 * D * Hq FLOPs each
    assert prefill_attention.causal_flops(3, 2, hq=1, d=1) == 4 * 9
    assert prefill_attention.causal_flops(0, 4, hq=2, d=8) == 4 * 8 * 2 * (1 + 2 + 3 + 4)


def test_prefill_bench_smoke_runs_every_option(tmp_path):
    # the whole script on CPU (interpreter kernels, tiny shapes), with the torch-SDPA split timed
    # beside the Triton kernel: a broken option costs a device call otherwise. In its own process:
    # TRITON_INTERPRET counts only before the first import of the kernels, which other tests did.
    script = Path(prefill_attention.__file__)
    subprocess.run([sys.executable, str(script), "--smoke", "--sdpa-split", "--shapes", "5:7,0:9", "--out",
                    str(tmp_path)], check=True, cwd=script.parent, env={**os.environ, "TRITON_INTERPRET": "1"},
                   capture_output=True, timeout=300)
    (md,) = tmp_path.glob("prefill_attention_*.md")
    text = md.read_text()
    assert "SDPA split cuDNN" in text and text.count("\n| ") == 3  # header + two shapes
