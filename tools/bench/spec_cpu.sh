#!/usr/bin/env bash
# CPU, served: speculative decoding on the re-quoting agentic trace with the default model
# (SmolLM2-135M-Instruct, real weights: it re-quotes), each method against the same server set-up,
# concurrency 1. The CPU counterpart of tools/bench/h200/spec.sh; run from the repository root with
# the venv active (`source .venv/bin/activate` after `make install`):
#   bash tools/bench/spec_cpu.sh OUTDIR [SECONDS]             # methods: METHODS="none ngram" (default)
#   METHODS="ngram suffix" EXTRA=--no-async-scheduling bash tools/bench/spec_cpu.sh OUTDIR 150
#   METHODS="none ngram ngram_gpu" CONCURRENCY=1,4 bash tools/bench/spec_cpu.sh OUTDIR 100
# Results: OUTDIR/spec_cpu_smol_<method>.{json,csv,png} (lightspeed-bench), OUTDIR/metrics_<method>.txt
# (the server's spec counters after the run), OUTDIR/serve_<method>.log.
set -uo pipefail
out=$1 secs=${2:-150}
mkdir -p "$out"
trace=$out/requote.jsonl
[ -f "$trace" ] || python3 tools/bench/requote_trace.py "$trace" --conversations 8 --turns 3 --file-lines 40 --output-tokens 200
for method in ${METHODS:-none ngram}; do
  spec=()
  [ "$method" != none ] && spec=(--speculative-config "{\"method\": \"$method\", \"num_speculative_tokens\": 4}")
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  lightspeed serve --port 8011 --max-model-len 8192 --max-num-seqs 4 ${EXTRA:-} "${spec[@]}" > "$out/serve_$method.log" 2>&1 &
  server=$!
  for i in $(seq 300); do curl -sf localhost:8011/health >/dev/null && break; sleep 1; done
  echo "$method ready after ${i}s"
  lightspeed-bench agentic --base-url http://127.0.0.1:8011 --trace "$trace" --no-progress --cache-page-size 16 \
    --concurrency "${CONCURRENCY:-1}" --max-duration "$secs" --request-timeout 300 --output-dir "$out" \
    --name "spec_cpu_smol_${method}" --label "cpu smol $method" 2>&1 | tail -4
  curl -s localhost:8011/metrics | grep -E "^lightspeed:spec_decode" > "$out/metrics_$method.txt" || true
  cat "$out/metrics_$method.txt"
  kill $server; wait $server
done
