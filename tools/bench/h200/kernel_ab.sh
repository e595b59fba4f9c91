#!/usr/bin/env bash
# A kernel choice A/B on the served path, one machine, one call: `lightspeed serve` on the 8B-shaped
# dummy folder twice, first with the default kernels, then with VAR=VALUE exported (a registry override
# such as LIGHTSPEED_KERNEL_OVERRIDE_GEMM_BF16=triton_gemv), each running random 1024/128 at c = 1 (the
# batch-1 TPOT against speed of light) and the agentic workload at c = 1, 4 (SECONDS per level).
#   bash tools/bench/h200/kernel_ab.sh OUTDIR VAR=VALUE [SECONDS]
# About 2 x (server start + 20 s + 2 x SECONDS + warm-ups): ~4.5 min at the default 30 s.
set -uo pipefail
out=$1; assignment=$2; secs=${3:-30}
case $assignment in *=*) ;; *) echo "usage: $0 OUTDIR VAR=VALUE [SECONDS]" >&2; exit 2 ;; esac
M=.dw-model/llama8b-smol
mkdir -p "$out"
common=(--base-url http://127.0.0.1:8000 --tokenizer $M --no-progress --cache-page-size 16 --request-timeout 120)

run() {  # run NAME [VAR=VALUE]
  local name=$1
  (if [ $# -gt 1 ]; then export "$2"; fi
   exec lightspeed serve $M --tokenizer $M --load-format dummy --port 8000 --max-model-len 65536 \
     --max-num-seqs 64) > "$out/${name}_serve.log" 2>&1 &
  local server=$!
  for i in $(seq 240); do curl -sf localhost:8000/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
  echo "$name: ready after ${i}s"
  lightspeed-bench agentic "${common[@]}" --mode random --input-tokens 1024 --output-tokens 128 --max-duration 20 \
    --concurrency 1 --output-dir "$out" --name "${name}_random1" --label "$name" 2>&1 | tail -2
  lightspeed-bench agentic "${common[@]}" --system-prompt-tokens 2000 --first-turn-tokens 20000 --turn-tokens 800 \
    --turns 6 --output-tokens 200 --concurrency 1,4 --max-duration "$secs" --output-dir "$out" \
    --name "${name}_agentic" --label "$name" 2>&1 | tail -3
  kill $server; wait $server
}

run default
run "${assignment#*=}" "$assignment"  # named by the value: triton_gemv, flashinfer_paged_prefill
