#!/usr/bin/env bash
# On the H200: DeepSeek-V3 in the engine. Three parts, each under 10 minutes (run them as separate calls):
#   bash tools/bench/h200/deepseek.sh tests  OUTDIR   # GPU tests: Triton MLA + FP8 kernels, CUDA graphs
#   bash tools/bench/h200/deepseek.sh decode OUTDIR   # deepseek-v3-6l FP8: decode step vs speed of light
#   bash tools/bench/h200/deepseek.sh serve  OUTDIR [AGENTIC_SECONDS] [TOKENIZER_DIR]
#                                                      # lightspeed serve, tools/bench/api_check.py (chat,
#                                                      # streaming, tools, structured output), then the
#                                                      # agentic sweep at c = 1, 4, 16
# The dummy model has DeepSeek-V3's 129280-token vocabulary; any tokenizer folder drives the workload
# (ids past its vocabulary decode to nothing), by default the one the 8B-shaped runs use.
set -uo pipefail
part=$1 out=$2
mkdir -p "$out"
case $part in
tests)
  python3 -m pytest -q -m gpu engine/tests/test_gpu_deepseek.py engine/tests/test_kv_mla.py \
    kernel/tests/triton/test_fused_moe.py kernel/tests/test_deepgemm.py -p no:cacheprovider \
    > "$out/deepseek_gpu_tests.log" 2>&1
  echo "gpu tests rc=$? $(tail -1 "$out/deepseek_gpu_tests.log")" ;;
decode)
  python3 tools/bench/deepseek_gpu.py --out "$out" 2>&1 | tail -14 ;;
serve)
  secs=${3:-30} tok=${4:-.dw-model/llama8b-smol}
  lightspeed serve deepseek-v3-6l --load-format dummy --tokenizer "$tok" --kv-cache-dtype fp8 --port 8000 \
    --max-model-len 32768 --max-num-seqs 64 > "$out/deepseek_serve.log" 2>&1 &
  server=$!
  for i in $(seq 600); do curl -sf localhost:8000/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
  echo "lightspeed ready after ${i}s"
  # chat, streaming, a forced and a required tool call, a JSON schema, completions, bad input
  python3 tools/bench/api_check.py --base-url http://127.0.0.1:8000 --out "$out/deepseek_api_check.json"
  lightspeed-bench agentic --base-url http://127.0.0.1:8000 --tokenizer "$tok" --no-progress --cache-page-size 16 \
    --system-prompt-tokens 2000 --first-turn-tokens 20000 --turn-tokens 800 --turns 6 --output-tokens 200 \
    --concurrency 1,4,16 --max-duration "$secs" --request-timeout 120 --output-dir "$out" \
    --name deepseek_v3_6l_agentic --label deepseek-v3-6l-fp8 2>&1 | tail -8
  kill $server; wait $server ;;
*) echo "usage: $0 tests|decode|serve OUTDIR [AGENTIC_SECONDS] [TOKENIZER_DIR]" >&2; exit 2 ;;
esac
