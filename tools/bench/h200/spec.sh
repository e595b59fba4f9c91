#!/usr/bin/env bash
# On the H200 (device kit installed): speculative decoding on the re-quoting agentic trace
# (tools/bench/requote_trace.py), against the same server without speculation, at c = 1, 4, 16.
# Each call stays under 10 minutes; run the methods as separate calls:
#   bash tools/bench/h200/spec.sh tests OUTDIR                      # GPU tests (spec CUDA graphs, device drafters)
#   bash tools/bench/h200/spec.sh smol  OUTDIR none|ngram|ngram_gpu|suffix [SECONDS] [K]
#                                       # SmolLM2-135M (real weights: they re-quote) served with that method
#   bash tools/bench/h200/spec.sh 8b    OUTDIR none|ngram|ngram_gpu|suffix [SECONDS] [K]
#                                       # the 8B-shaped dummy model: overhead only (random weights do not re-quote)
# CONCURRENCY=16 (environment) runs other levels than 1,4,16; PROFILE=1 samples the engine core (below).
# Results: OUTDIR/spec_<model>_<method>_<UTC time>.{json,csv,png}; each JSON holds per level tok/s/user,
# output tokens/min, and the server's spec_acceptance_length (tokens a drafting row keeps per step).
set -uo pipefail
part=$1 out=$2 method=${3:-none} secs=${4:-40} k=${5:-4}
mkdir -p "$out"
stamp=$(date -u +%Y%m%d_%H%M%S)
case $part in
tests)
  python3 -m pytest -q -m gpu engine/tests/test_cuda_graph.py engine/tests/test_gpu_engine.py -p no:cacheprovider \
    > "$out/spec_gpu_tests.log" 2>&1
  echo "gpu tests rc=$? $(tail -1 "$out/spec_gpu_tests.log")"; exit 0 ;;
smol) model=() tok=(); name=smol ;;
8b) model=(.dw-model/llama8b-smol --load-format dummy) tok=(--tokenizer .dw-model/llama8b-smol); name=llama8b ;;
*) echo "usage: $0 tests|smol|8b OUTDIR [none|ngram|ngram_gpu|suffix] [SECONDS] [K]" >&2; exit 2 ;;
esac
case $method in
none) spec=() ;;
ngram|ngram_gpu|suffix) spec=(--speculative-config "{\"method\": \"$method\", \"num_speculative_tokens\": $k}") ;;
*) echo "unknown method $method" >&2; exit 2 ;;
esac
trace=$out/requote.jsonl
[ -f "$trace" ] || python3 tools/bench/requote_trace.py "$trace" --conversations 48 --turns 4 --output-tokens 400
# SERVE_ARGS (environment): more `lightspeed serve` flags, e.g. for an A/B of one setting.
# shellcheck disable=SC2086
lightspeed serve "${model[@]}" "${tok[@]}" --port 8000 --max-model-len 8192 --max-num-seqs 64 "${spec[@]}" ${SERVE_ARGS:-} \
  > "$out/spec_${name}_${method}_serve.log" 2>&1 &
server=$!
for i in $(seq 300); do curl -sf localhost:8000/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
echo "lightspeed ($name, $method) ready after ${i}s"
# PROFILE=1: py-spy on the engine core + dmon for 10 s, 8 s after the GPU first works (use it with a
# single CONCURRENCY level, so the sample is of that level).
[ -n "${PROFILE:-}" ] && bash tools/bench/h200/profile_core.sh "$out" "spec_${name}_${method}_${stamp}" 8 10 &
lightspeed-bench agentic --base-url http://127.0.0.1:8000 --trace "$trace" --no-progress --cache-page-size 16 \
  --concurrency "${CONCURRENCY:-1,4,16}" --max-duration "$secs" --request-timeout 120 --output-dir "$out" \
  --name "spec_${name}_${method}_${stamp}" --label "$name $method k=$k" 2>&1 | tail -6
curl -s localhost:8000/metrics | grep -E "^lightspeed:spec_decode_num" || true
kill $server; wait $server
