#!/usr/bin/env bash
# CPU: SmolLM2 (real weights) on the re-quoting trace, no speculation vs n-gram k=4, c=1.
set -uo pipefail
out=$1 secs=${2:-150}
source /work/main/.venv/bin/activate
cd /work/main
trace=$out/requote.jsonl
[ -f "$trace" ] || python3 tools/bench/requote_trace.py "$trace" --conversations 8 --turns 3 --file-lines 40 --output-tokens 200
for method in ${METHODS:-none ngram}; do
  spec=()
  [ $method != none ] && spec=(--speculative-config "{\"method\": \"$method\", \"num_speculative_tokens\": 4}")
  lightspeed serve --port 8011 --max-model-len 8192 --max-num-seqs 4 ${EXTRA:-} "${spec[@]}" > "$out/serve_$method.log" 2>&1 &
  server=$!
  for i in $(seq 300); do curl -sf localhost:8011/health >/dev/null && break; sleep 1; done
  echo "$method ready after ${i}s"
  lightspeed-bench agentic --base-url http://127.0.0.1:8011 --trace "$trace" --no-progress --cache-page-size 16 \
    --concurrency 1 --max-duration "$secs" --request-timeout 300 --output-dir "$out" \
    --name "spec_cpu_smol_${method}" --label "cpu smol $method" 2>&1 | tail -4
  curl -s localhost:8011/metrics | grep -E "^lightspeed:spec_decode" > "$out/metrics_$method.txt" || true
  cat "$out/metrics_$method.txt"
  kill $server; wait $server
done
