#!/usr/bin/env bash
# On the H200: conversations that outgrow the device KV but fit the host tier. The same run with the
# host tier on and off (--host-cache-memory 0); 16 conversations of a 22K-token first turn + 6 turns, c=16.
#   bash tools/bench/h200/memory_pressure.sh OUTDIR [SECONDS] [HOST_BYTES]
set -uo pipefail
out=$1; secs=${2:-120}; host=${3:-56GiB}
M=.dw-model/llama8b-smol
mkdir -p "$out"
for tier in "$host" 0; do
  name=pressure_host_${tier}
  lightspeed serve $M --tokenizer $M --load-format dummy --port 8000 --max-model-len 40000 --max-num-seqs 64 \
    --kv-cache-memory 12GiB --host-cache-memory "$tier" > "$out/${name}_serve.log" 2>&1 &
  server=$!
  for i in $(seq 240); do curl -sf localhost:8000/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
  echo "$name: ready after ${i}s"
  lightspeed-bench agentic --base-url http://127.0.0.1:8000 --tokenizer $M --no-progress --cache-page-size 16 \
    --system-prompt-tokens 2000 --first-turn-tokens 20000 --turn-tokens 800 --turns 6 --output-tokens 200 \
    --concurrency 16 --num-conversations 16 --warmup-requests 0 --max-duration "$secs" --request-timeout 300 \
    --output-dir "$out" --name "$name" --label "host tier $tier" 2>&1 | tail -4
  curl -s localhost:8000/metrics | grep -E "^lightspeed:(prefix|kv|num_)" > "$out/${name}_metrics.txt"
  kill $server; wait $server
done
