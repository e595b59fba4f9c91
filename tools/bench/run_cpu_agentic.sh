#!/usr/bin/env bash
# The CPU agentic run of issue 7 (item 6): `lightspeed serve` with the default model
# (SmolLM2-135M-Instruct GGUF), a ~2K-token first turn (512 shared system + 1536 repo context),
# 100-token tool turns, 32 output tokens, 3 turns, concurrency 1,2,4. Per level no request starts
# after MAX_DURATION s and in-flight ones are cancelled DRAIN s later, so the sweep is bounded
# by 3 x (MAX_DURATION + DRAIN) (default 10.5 min; 5 min with MAX_DURATION=60 DRAIN=40, enough
# once the engine's CPU decode is fast). No warm-up exclusion: each level has few requests.
# Writes bench/results/agentic_<date>_cpu.{json,csv,png}.
#
#   tools/bench/run_cpu_agentic.sh            # from the repo root, after `make install`
#   SERVE_ARGS="--max-num-seqs 8" tools/bench/run_cpu_agentic.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv}
PORT=${PORT:-$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
NAME=${NAME:-agentic_$(date -u +%Y%m%d)_cpu}
MAX_DURATION=${MAX_DURATION:-120}
DRAIN=${DRAIN:-90}
LOG=${LOG:-/tmp/lightspeed_serve_$PORT.log}

"$VENV/bin/lightspeed" serve --host 127.0.0.1 --port "$PORT" ${SERVE_ARGS:-} >"$LOG" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true' EXIT

for _ in $(seq 1 300); do  # model load: up to 5 minutes
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "lightspeed serve exited; see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "server not healthy after 300 s; see $LOG" >&2; exit 1; }

"$VENV/bin/lightspeed-bench" agentic \
  --base-url "http://127.0.0.1:$PORT" \
  --system-prompt-tokens 512 --first-turn-tokens 1536 --turn-tokens 100 --turn-jitter 0.2 \
  --turns 3 --output-tokens 32 --concurrency 1,2,4 --warmup-requests 0 \
  --max-duration "$MAX_DURATION" --drain-timeout "$DRAIN" --request-timeout 600 \
  --cache-page-size 16 --num-gpus 1 --label "lightspeed serve, CPU (SmolLM2-135M Q4_1 GGUF, 2 cores)" \
  --output-dir bench/results --name "$NAME" "$@"
