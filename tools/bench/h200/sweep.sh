#!/usr/bin/env bash
# The side-by-side sweep against one server at 127.0.0.1:$PORT (Lightspeed or vLLM, same model folder):
# the agentic workload of the served-path issue at c = 1, 4, 16 (AGENTIC_SECONDS per level) and c = 32
# (twice as long), then random 1024/128 at 1 and 32, and at 128 on its own (`*_random128`).
#   bash tools/bench/h200/sweep.sh NAME OUTDIR MODEL_DIR [AGENTIC_SECONDS]
# PROFILE=1: while the random c=128 level runs, the engine core is sampled by py-spy and the GPU by dmon.
# AGENTIC_LEVELS (default 1,4,16; `none` skips the agentic workload, c=32 included) and AGENTIC32=0 (skip c=32)
# shorten a lease that cannot afford the whole sweep; so does RANDOM_LEVELS (default 1,32; `none`: only c=128).
set -uo pipefail
name=$1 out=$2 model=$3 secs=${4:-30}
port=${PORT:-8000}
mkdir -p "$out"
common=(--base-url "http://127.0.0.1:$port" --tokenizer "$model" --no-progress --cache-page-size 16)
agentic=(--system-prompt-tokens 2000 --first-turn-tokens 20000 --turn-tokens 800 --turns 6 --output-tokens 200
         --request-timeout 120)
levels=${AGENTIC_LEVELS:-1,4,16}
[ "$levels" = none ] || lightspeed-bench agentic "${common[@]}" "${agentic[@]}" --concurrency "$levels" --max-duration "$secs" \
  --output-dir "$out" --name "${name}_agentic" --label "$name" 2>&1 | tail -6
# c=32: its 32 warm-up first turns (700K prompt tokens) take most of a short level; give it longer.
[ "${AGENTIC32:-1}" = 0 ] || [ "$levels" = none ] || lightspeed-bench agentic "${common[@]}" "${agentic[@]}" --concurrency 32 --max-duration "$((secs * 2))" \
  --output-dir "$out" --name "${name}_agentic32" --label "$name" 2>&1 | tail -3
# The server's counters after the agentic levels (Lightspeed: answers remembered / refused / spliced and
# prefix hits by tier; vLLM: its prefix-cache queries and hits), to read the later-turn misses against.
curl -sf "http://127.0.0.1:$port/metrics" > "$out/${name}_metrics_after_agentic.txt" || true
random=(--mode random --input-tokens 1024 --output-tokens 128 --max-duration 20 --request-timeout 120)
rlevels=${RANDOM_LEVELS:-1,32}
[ "$rlevels" = none ] || lightspeed-bench agentic "${common[@]}" "${random[@]}" --concurrency "$rlevels" --output-dir "$out" \
  --name "${name}_random" --label "$name" 2>&1 | tail -5
# c=128 alone, so the samples cover that level, not a guess of when it starts in a multi-level run;
# sampled by dmon and (for Lightspeed) py-spy once the GPU reports work (profile_core.sh).
[ -n "${PROFILE:-}" ] && bash tools/bench/h200/profile_core.sh "$out" "${name}_c128" 4 10 &
lightspeed-bench agentic "${common[@]}" "${random[@]}" --concurrency 128 --output-dir "$out" \
  --name "${name}_random128" --label "$name" 2>&1 | tail -3
wait
