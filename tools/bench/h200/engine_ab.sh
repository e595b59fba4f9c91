#!/usr/bin/env bash
# On the H200 (device kit installed): an environment A/B through the real engine, one machine, one call:
# engine_gpu.py's batch-1 step and 32-concurrent throughput (llama-3.1-8b preset, 1K context) and
# profile_gpu.py's decode_b1 kernel table, once with VAR=A and once with VAR=B. Writes the value with the
# shorter batch-1 step to CHOICE_FILE (default /tmp/ab_choice) for a later call of the same lease.
#   bash tools/bench/h200/engine_ab.sh OUTDIR COMMIT VAR A B
# About 2 x 100 s.
set -uo pipefail
out=$(realpath -m "$1"); commit=$2; var=$3; a=$4; b=$5; choice_file=${CHOICE_FILE:-/tmp/ab_choice}
mkdir -p "$out"
for value in "$a" "$b"; do
  mkdir -p "$out/$value"
  (export "$var=$value"
   cd tools/bench
   python3 engine_gpu.py --no-hf --no-eager-compare --batches 32 --out "$out/$value" > "$out/$value/engine_gpu.log" 2>&1
   echo "$var=$value engine_gpu rc=$?: $(grep 'batch 1:' "$out/$value/engine_gpu.log")"
   python3 profile_gpu.py --scenarios decode_b1 --out "$out/$value" --commit "$commit" > "$out/$value/profile.log" 2>&1
   echo "$var=$value profile rc=$?: $(grep -h 'GPU busy' "$out/$value"/profile_gpu_*.md | head -1)")
done
python3 - "$out" "$choice_file" "$a" "$b" <<'PY'
import glob, json, sys
out, choice_file, *values = sys.argv[1:]
step = {}
for value in values:
    files = sorted(glob.glob(f"{out}/{value}/engine_gpu_*.json"))
    if files:
        step[value] = json.load(open(files[-1]))["batch1"]["median_step_ms"]
print("batch-1 step ms:", step)
best = min(step, key=step.get) if len(step) == len(values) else values[0]
open(choice_file, "w").write(best)
print("choice:", best)
PY
