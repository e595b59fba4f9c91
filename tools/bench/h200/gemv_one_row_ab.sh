#!/usr/bin/env bash
# On the H200 (device kit installed): the batch-1 step with cuBLAS vs the skinny GEMM at one row
# (LIGHTSPEED_KERNEL_OVERRIDE_GEMM_BF16=triton_gemv_one_row), through the real engine: engine_gpu.py's
# batch-1 step (llama-3.1-8b preset, 1K context) and profile_gpu.py's decode_b1 kernel table, each run
# once per choice. Writes the faster choice to CHOICE_FILE (default /tmp/gemm_choice) for a later call
# of the same lease (`export LIGHTSPEED_KERNEL_OVERRIDE_GEMM_BF16=$(cat /tmp/gemm_choice)`).
#   bash tools/bench/h200/gemv_one_row_ab.sh OUTDIR COMMIT
set -uo pipefail
out=$(realpath -m "$1"); commit=$2; choice_file=${CHOICE_FILE:-/tmp/gemm_choice}
mkdir -p "$out"
for which in cublas_linear triton_gemv_one_row; do
  mkdir -p "$out/$which"
  (export LIGHTSPEED_KERNEL_OVERRIDE_GEMM_BF16=$which
   cd tools/bench
   python3 engine_gpu.py --no-hf --no-eager-compare --batches 32 --out "$out/$which" > "$out/$which/engine_gpu.log" 2>&1
   echo "$which engine_gpu rc=$?: $(grep 'batch 1:' "$out/$which/engine_gpu.log")"
   python3 profile_gpu.py --scenarios decode_b1 --out "$out/$which" --commit "$commit" > "$out/$which/profile.log" 2>&1
   echo "$which profile rc=$?: $(grep -h 'GPU busy' "$out/$which"/profile_gpu_*.md | head -1)")
done
python3 - "$out" "$choice_file" <<'PY'
import glob, json, sys
out, choice_file = sys.argv[1:]
step = {}
for which in ("cublas_linear", "triton_gemv_one_row"):
    files = sorted(glob.glob(f"{out}/{which}/engine_gpu_*.json"))
    if files:
        step[which] = json.load(open(files[-1]))["batch1"]["median_step_ms"]
print("batch-1 step ms:", step)
best = min(step, key=step.get) if len(step) == 2 else "cublas_linear"
open(choice_file, "w").write(best)
print("choice:", best)
PY
