#!/usr/bin/env bash
# On the H200 (device kit installed): Lightspeed's GPU tests of the async KV tier, then `lightspeed serve`
# on the 8B-shaped dummy folder and the side-by-side sweep (sweep.sh), with py-spy + dmon at 128 concurrent.
#   bash tools/bench/h200/lightspeed.sh OUTDIR [AGENTIC_SECONDS] [SERVE_ARGS...]
set -uo pipefail
out=$1; secs=${2:-30}; shift 2 || shift $#
M=.dw-model/llama8b-smol
mkdir -p "$out"
# TESTS: the GPU test files run first (default: the async KV tier's); TESTS=none skips them (a later call
# of the same lease that already ran them).
tests=${TESTS:-engine/tests/test_gpu_engine.py engine/tests/test_kv.py}
if [ "$tests" != none ]; then
  python3 -m pytest -q -m gpu $tests -p no:cacheprovider > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? $(tail -1 "$out/gpu_tests.log")"
fi
lightspeed serve $M --tokenizer $M --load-format dummy --port 8000 --max-model-len 65536 --max-num-seqs 64 "$@" \
  > "$out/lightspeed_serve.log" 2>&1 &
server=$!
# Ready includes the start-up warm-up request, which JIT-compiles FlashInfer's prefill on a fresh machine.
for i in $(seq 480); do curl -sf localhost:8000/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
echo "lightspeed ready after ${i}s; $(grep -o "warm-up request done in [0-9.]* s" "$out/lightspeed_serve.log")"
# NO_SWEEP=1: start, warm up and stop (fills FlashInfer's JIT cache for a later call on the same machine).
[ -n "${NO_SWEEP:-}" ] || PROFILE=1 bash tools/bench/h200/sweep.sh lightspeed "$out" $M "$secs"
kill $server; wait $server
