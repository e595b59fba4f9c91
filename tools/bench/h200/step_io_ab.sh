#!/usr/bin/env bash
# On the GPU (device kit installed): LIGHTSPEED_STEP_IO's modes against each other (engine/lightspeed/runner/step_io.py).
#   bash tools/bench/h200/step_io_ab.sh profile OUTDIR            # ~7 min: GPU tests, then in process
#   bash tools/bench/h200/step_io_ab.sh served OUTDIR [MODES]     # ~8 min: served, random 1024/128 c = 32, 128
# profile: the step-IO GPU tests, then profile_gpu.py's decode_b64 and churn_128 with traces under each of
# compute / stream / kernel, and trace_gaps.py --copy-waits on every trace (traces over 20 MB are deleted after:
# too big to bring back). churn_128's unprofiled output tok/s is the figure; the gaps say whether a copy still
# queued behind the KV write-through. served: `lightspeed serve` once per mode in MODES (default "stream kernel
# stream kernel", so each mode runs twice, interleaved), each measured with random 1024/128 at c = 32 and 128.
set -uo pipefail
what=$1; out=$(realpath -m "$2"); modes=${3:-stream kernel stream kernel}
mkdir -p "$out"
case $what in
profile)
  python3 -m pytest -q -m gpu kernel/tests/triton/test_memory.py engine/tests/test_step_io.py \
    engine/tests/test_gpu_engine.py engine/tests/test_cuda_graph.py -p no:cacheprovider > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? $(tail -1 "$out/gpu_tests.log")"
  python3 -m pytest -q kernel/tests/triton/test_memory.py -p no:cacheprovider > "$out/memory_tests_cuda.log" 2>&1
  echo "host_copy kernel tests on the device rc=$? $(tail -1 "$out/memory_tests_cuda.log")"
  cd tools/bench
  for mode in compute stream kernel; do
    LIGHTSPEED_STEP_IO=$mode timeout 200 python3 profile_gpu.py --out "$out/$mode" --scenarios decode_b64,churn_128 \
      --trace > "$out/$mode.log" 2>&1
    echo "$mode rc=$?: $(grep -h 'unprofiled' "$out/$mode.log")"
    for trace in "$out/$mode"/*.trace.json; do
      [ -e "$trace" ] || continue
      steps=$(case $trace in *decode_b64*) echo 62;; *) echo 100;; esac)  # the steps each scenario profiles
      python3 trace_gaps.py "$trace" --steps "$steps" --copy-waits --json "${trace%.trace.json}.gaps.json" \
        > "${trace%.trace.json}.gaps.txt" 2>&1
      echo "  $(basename "$trace"): $(head -1 "${trace%.trace.json}.gaps.txt" | sed 's/.*= busy/busy/')"
      grep -h "^stream" "${trace%.trace.json}.gaps.txt" | sed 's/^/    /'
    done
    find "$out/$mode" -name '*.trace.json' -size +20M -delete
  done
  ;;
served)
  # lightspeed.sh serves, waits and stops; sweep.sh's level variables keep only random c = 32 and 128.
  i=0
  for mode in $modes; do
    i=$((i + 1)); name=${mode}_$i
    LIGHTSPEED_STEP_IO=$mode AGENTIC_LEVELS=none RANDOM_LEVELS=32 TESTS=none \
      bash tools/bench/h200/lightspeed.sh "$out/$name"
    echo "$name: $(grep -o 'step transfers through pinned memory do not work[^;]*' "$out/$name/lightspeed_serve.log")"
  done
  ;;
*) echo "usage: step_io_ab.sh profile|served OUTDIR [MODES]" >&2; exit 2 ;;
esac
