#!/usr/bin/env bash
# The disk KV tier, served. On the H200 (default): device and host KV deliberately small for the
# 8B-shaped dummy model (12 GiB device + 8 GiB host: about 10 conversations of 15K tokens at 128 KiB a
# token), 24 conversations at c=16 (a 46 GB working set), the same run without and with
# --disk-cache-dir (36 GiB: the one-GPU machine has a 64 GiB disk), then the server restarted on the
# same directory and the same conversations: their first turns find the prefixes on disk. TTFT and
# output tokens/min per run. MACHINE=cpu: the same three runs with the default model (SmolLM2-135M,
# 45 KiB of fp32 KV a token) sized for two CPU cores (256 MiB device + 128 MiB host, 8 conversations
# of about 1.5K tokens at c=4: a 550 MB working set).
#   [MACHINE=cpu] bash tools/bench/h200/disk_tier.sh OUTDIR tests|off|on|restart|all [SECONDS] [DISK_DIR]
# Each part is one server start plus at most SECONDS of load (about 4 min at the default 90 s);
# "restart" needs the directory "on" filled, on the same machine.
set -uo pipefail
out=$1; part=$2; secs=${3:-90}; dir=${4:-/tmp/lightspeed-disk-kv}
machine=${MACHINE:-h200}; port=${PORT:-8000}
mkdir -p "$out"
if [ "$machine" = cpu ]; then
  M=""; disk_size=2GiB
  serve=(--max-model-len 4096 --max-num-seqs 8 --kv-cache-memory 256MiB --host-cache-memory 128MiB)
  load=(--system-prompt-tokens 200 --first-turn-tokens 1000 --turn-tokens 100 --turns 3 --output-tokens 16
        --concurrency 4 --num-conversations 8)
else
  M=.dw-model/llama8b-smol; disk_size=36GiB
  serve=($M --tokenizer $M --load-format dummy --max-model-len 32768 --max-num-seqs 64
         --kv-cache-memory 12GiB --host-cache-memory 8GiB)
  load=(--tokenizer $M --system-prompt-tokens 2000 --first-turn-tokens 8000 --turn-tokens 800 --turns 6
        --output-tokens 200 --concurrency 16 --num-conversations 24)
fi

run() {  # run NAME LABEL SALT [SERVE_ARGS...]
  local name=$1_$(date -u +%Y-%m-%d_%H%M%S)_$machine label=$2 salt=$3
  shift 3
  lightspeed serve "${serve[@]}" --port $port "$@" > "$out/${name}_serve.log" 2>&1 &
  local server=$!
  for i in $(seq 300); do curl -sf localhost:$port/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
  echo "$name: ready after ${i}s"
  lightspeed-bench agentic --base-url http://127.0.0.1:$port --no-progress --cache-page-size 16 "${load[@]}" \
    --warmup-requests 0 --max-duration "$secs" --request-timeout 300 \
    --salt "$salt" --output-dir "$out" --name "$name" --label "$label" 2>&1 | tail -4
  curl -s localhost:$port/metrics | grep -E "^lightspeed:(prefix|kv|num_)" > "$out/${name}_metrics.txt"
  grep -E "disk KV tier|writes stopped" "$out/${name}_serve.log" | tail -3
  kill $server; wait $server
}

case $part in
tests)
  python3 -m pytest -q -m gpu engine/tests/test_engine_disk.py -p no:cacheprovider > "$out/disk_gpu_tests.log" 2>&1
  echo "disk gpu tests rc=$? $(tail -1 "$out/disk_gpu_tests.log")" ;;
off) run disk_off "disk tier off" disk-bench-off ;;
on) rm -rf "$dir"; run disk_on "disk tier on" disk-bench --disk-cache-dir "$dir" --disk-cache-size $disk_size ;;
restart) run disk_restart "disk tier on, after a restart" disk-bench --disk-cache-dir "$dir" --disk-cache-size $disk_size ;;
all) "$0" "$out" tests; "$0" "$out" off "$secs" "$dir"; "$0" "$out" on "$secs" "$dir"; "$0" "$out" restart "$secs" "$dir" ;;
*) echo "usage: $0 OUTDIR tests|off|on|restart|all [SECONDS] [DISK_DIR]" >&2; exit 2 ;;
esac
