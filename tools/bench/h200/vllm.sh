#!/usr/bin/env bash
# On the H200, after the vLLM parts are in /tmp/peer (../shared/peers/vllm/README.md): install vLLM 0.26.0
# into /tmp/vsite, serve the same dummy folder with the same limits, run the same sweep (sweep.sh).
#   bash tools/bench/h200/vllm.sh OUTDIR [AGENTIC_SECONDS]
set -uo pipefail
out=$1; secs=${2:-30}
M=.dw-model/llama8b-smol
mkdir -p "$out"
bash /tmp/peer/install_on_device.sh /tmp/peer /tmp/vsite > "$out/vllm_install.log" 2>&1 || { tail -5 "$out/vllm_install.log"; exit 1; }
(export PYTHONPATH=/tmp/vsite VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
 exec python3 -m vllm.entrypoints.openai.api_server --model $M --load-format dummy --port 8000 \
   --max-model-len 65536 --max-num-seqs 64 --enable-prompt-tokens-details --served-model-name llama8b-smol) \
  > "$out/vllm_serve.log" 2>&1 &
server=$!
for i in $(seq 300); do curl -sf localhost:8000/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
echo "vllm ready after ${i}s"
PROFILE=1 bash tools/bench/h200/sweep.sh vllm "$out" $M "$secs"  # dmon at c=128 (no py-spy: no engine core)
kill $server; wait $server
