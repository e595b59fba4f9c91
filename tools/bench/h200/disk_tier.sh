#!/usr/bin/env bash
# On the H200: the disk KV tier. Device and host KV deliberately small for the 8B-shaped dummy model
# (12 GiB device + 8 GiB host: about 10 conversations of 15K tokens at 128 KiB a token), 24
# conversations at c=16 (a 46 GB working set), the same run without and with --disk-cache-dir (36 GiB:
# the one-GPU machine has a 64 GiB disk), then the server restarted on the same directory and the same
# conversations: their first turns find the prefixes on disk. TTFT and output tokens/min per run.
#   bash tools/bench/h200/disk_tier.sh OUTDIR tests|off|on|restart|all [SECONDS] [DISK_DIR]
# Each part is one server start plus SECONDS of load (about 4 min at the default 90 s); "restart"
# needs the directory "on" filled, on the same machine.
set -uo pipefail
out=$1; part=$2; secs=${3:-90}; dir=${4:-/tmp/lightspeed-disk-kv}
M=.dw-model/llama8b-smol
mkdir -p "$out"

run() {  # run NAME LABEL SALT [SERVE_ARGS...]
  local name=$1_$(date -u +%Y-%m-%d_%H%M%S)_h200 label=$2 salt=$3
  shift 3
  lightspeed serve $M --tokenizer $M --load-format dummy --port 8000 --max-model-len 32768 --max-num-seqs 64 \
    --kv-cache-memory 12GiB --host-cache-memory 8GiB "$@" > "$out/${name}_serve.log" 2>&1 &
  local server=$!
  for i in $(seq 300); do curl -sf localhost:8000/health >/dev/null && break; sleep 1; done
  echo "$name: ready after ${i}s"
  lightspeed-bench agentic --base-url http://127.0.0.1:8000 --tokenizer $M --no-progress --cache-page-size 16 \
    --system-prompt-tokens 2000 --first-turn-tokens 8000 --turn-tokens 800 --turns 6 --output-tokens 200 \
    --concurrency 16 --num-conversations 24 --warmup-requests 0 --max-duration "$secs" --request-timeout 300 \
    --salt "$salt" --output-dir "$out" --name "$name" --label "$label" 2>&1 | tail -4
  curl -s localhost:8000/metrics | grep -E "^lightspeed:(prefix|kv|num_)" > "$out/${name}_metrics.txt"
  grep -E "disk KV tier|writes stopped" "$out/${name}_serve.log" | tail -3
  kill $server; wait $server
}

case $part in
tests)
  python3 -m pytest -q -m gpu engine/tests/test_engine_disk.py -p no:cacheprovider > "$out/disk_gpu_tests.log" 2>&1
  echo "disk gpu tests rc=$? $(tail -1 "$out/disk_gpu_tests.log")" ;;
off) run disk_off "disk tier off" disk-bench-off ;;
on) rm -rf "$dir"; run disk_on "disk tier on" disk-bench --disk-cache-dir "$dir" --disk-cache-size 36GiB ;;
restart) run disk_restart "disk tier on, after a restart" disk-bench --disk-cache-dir "$dir" --disk-cache-size 36GiB ;;
all) "$0" "$out" tests; "$0" "$out" off "$secs" "$dir"; "$0" "$out" on "$secs" "$dir"; "$0" "$out" restart "$secs" "$dir" ;;
*) echo "usage: $0 OUTDIR tests|off|on|restart|all [SECONDS] [DISK_DIR]" >&2; exit 2 ;;
esac
