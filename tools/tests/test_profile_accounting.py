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


class _ClosedLoopEngine:
    """An engine's step interface over `slots` running requests, each producing one token a step and
    finishing after `out_len`; what run_churn needs, without a model."""

    def __init__(self, m, slots: int, out_len: int):
        self.m, self.slots, self.out_len = m, slots, out_len
        self.queue: list[str] = []
        self.made: dict[str, int] = {}
        self.aborted: list[str] = []
        self.queued_at_step: list[int] = []
        self.submitted: list[str] = []

    def add_request(self, req):
        self.queue.append(req.request_id)
        self.submitted.append(req.request_id)

    def step(self):
        self.queued_at_step.append(len(self.queue))
        running = self.queue[: self.slots]
        finished = {}
        for rid in running:
            self.made[rid] = self.made.get(rid, 0) + 1
            if self.made[rid] == self.out_len:
                finished[rid] = "length"
        self.queue = [r for r in self.queue if r not in finished]
        return self.m.StepOutputs(request_ids=running, token_ids=[7] * len(running), finished=finished or None)

    def abort_requests(self, names):
        self.aborted += names
        self.queue = [r for r in self.queue if r not in names]

    def has_work(self):
        return bool(self.queue)

    def has_pending_copies(self):
        return False


def test_host_transfers_are_their_own_category_and_left_out_of_compute_busy():
    assert profile_gpu.category("Memcpy DtoH (Device -> Pinned)") == "host transfer"
    assert profile_gpu.category("Memcpy HtoD (Pinned -> Device)") == "host transfer"
    assert profile_gpu.category("Memcpy DtoD (Device -> Device)") == "copy"
    events = [("_decode_kernel", 0, 10), ("Memcpy DtoH (Device -> Pinned)", 5, 30), ("nvjet_sm90_tst", 12, 20)]
    assert profile_gpu.busy_split(events) == (30.0, 18.0)


def test_churn_keeps_every_client_busy_and_counts_its_tokens():
    from lightspeed.core import messages as m

    engine = _ClosedLoopEngine(m, slots=4, out_len=3)
    out = profile_gpu.run_churn(engine, m, lambda n: [1] * n, prompt_len=5, out_len=3, outstanding=6, warm_steps=5,
                                timed_steps=6, profiled_steps=2, trace_dir=None)
    # every step of the three windows starts with all six clients' requests in: each finish was replaced
    assert engine.queued_at_step == [6] * (5 + 6 + 2)
    assert out["unprofiled"]["steps"] == 6 and out["unprofiled"]["output_tokens"] == 6 * 4  # four slots a step
    assert out["steps"] == 2 and out["prompts"] == 6 and out["prompt_tokens"] == 5
    finished = {rid for rid, made in engine.made.items() if made == 3}
    assert sorted(engine.aborted) == sorted(set(engine.submitted) - finished)  # what was left is aborted
