#!/usr/bin/env bash
# The side-by-side sweep against one server at 127.0.0.1:$PORT (Lightspeed or vLLM, same model folder):
# the agentic workload of the served-path issue at c = 1, 4, 16 (AGENTIC_SECONDS per level) and c = 32
# (twice as long), then random 1024/128 at 1 and 32, and at 128 on its own (`*_random128`).
#   bash tools/bench/h200/sweep.sh NAME OUTDIR MODEL_DIR [AGENTIC_SECONDS]
# While the random c=128 level runs, PROFILE_PID (if set) is sampled by py-spy and the GPU by dmon.
set -uo pipefail
name=$1 out=$2 model=$3 secs=${4:-30}
port=${PORT:-8000}
mkdir -p "$out"
common=(--base-url "http://127.0.0.1:$port" --tokenizer "$model" --no-progress --cache-page-size 16)
agentic=(--system-prompt-tokens 2000 --first-turn-tokens 20000 --turn-tokens 800 --turns 6 --output-tokens 200
         --request-timeout 120)
lightspeed-bench agentic "${common[@]}" "${agentic[@]}" --concurrency 1,4,16 --max-duration "$secs" \
  --output-dir "$out" --name "${name}_agentic" --label "$name" 2>&1 | tail -6
# c=32: its 32 warm-up first turns (700K prompt tokens) take most of a short level; give it longer.
lightspeed-bench agentic "${common[@]}" "${agentic[@]}" --concurrency 32 --max-duration "$((secs * 2))" \
  --output-dir "$out" --name "${name}_agentic32" --label "$name" 2>&1 | tail -3
random=(--mode random --input-tokens 1024 --output-tokens 128 --max-duration 20 --request-timeout 120)
lightspeed-bench agentic "${common[@]}" "${random[@]}" --concurrency 1,32 --output-dir "$out" \
  --name "${name}_random" --label "$name" 2>&1 | tail -5
# c=128 alone, so the GPU-busy and py-spy samples cover that level (after its warm-up), not a guess of
# when it starts inside a multi-level run.
# The bench builds and tokenises the level's 512 prompts first (~16 s at 128) with the GPU idle, so the
# samplers start once the GPU reports work (then 4 s more, past the first prefills), not on a timer.
if [ -n "${PROFILE_PID:-}" ]; then
  (for _ in $(seq 120); do
     busy=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | head -1)
     [ "${busy:-0}" -gt 0 ] && break; sleep 0.5
   done; sleep 4
   nvidia-smi dmon -s u -c 10 > "$out/${name}_dmon_c128.txt" 2>&1 &
   py-spy record -p "$PROFILE_PID" -d 10 -r 200 -f raw --nonblocking -o "$out/${name}_pyspy_c128.txt" \
     > "$out/${name}_pyspy.log" 2>&1
   wait) &
fi
lightspeed-bench agentic "${common[@]}" "${random[@]}" --concurrency 128 --output-dir "$out" \
  --name "${name}_random128" --label "$name" 2>&1 | tail -3
wait
