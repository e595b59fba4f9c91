#!/usr/bin/env bash
# CPU, served: the model drafters end to end. EAGLE-3 with a random-initialised head on the default
# model (SmolLM2-135M, real weights) over the re-quoting trace, and MTP on a DeepSeek-V3-shaped dummy
# (random weights and MTP module, SmolLM2's tokenizer) over random prompts; each beside the same
# server without speculation. Random heads accept little: these runs show the paths serve and count,
# not a speed-up. Run from the repository root with the venv active:
#   bash tools/bench/spec_heads_cpu.sh OUTDIR [SECONDS]
# Results: OUTDIR/spec_heads_<model>_<method>.{json,csv,png}, OUTDIR/metrics_<model>_<method>.txt
# (the server's spec counters after the run), OUTDIR/serve_<model>_<method>.log.
set -uo pipefail
out=$1 secs=${2:-60}
mkdir -p "$out"
trace=$out/requote.jsonl
[ -f "$trace" ] || python3 tools/bench/requote_trace.py "$trace" --conversations 8 --turns 3 --file-lines 40 --output-tokens 200
smol=$(python3 -c "from lightspeed.model_files import default_model; print(default_model())")
# A random EAGLE-3 head for SmolLM2 and a DeepSeek-V3-shaped config with its vocabulary.
python3 - "$out" "$smol" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "engine/tests")
from spec_helpers import write_random_eagle3_head
from lightspeed.loader import load_model
from lightspeed.models import preset_hf_config
out, smol = Path(sys.argv[1]), sys.argv[2]
_, config = load_model(smol, progress=False)
write_random_eagle3_head(out / "eagle3_head", config)
(out / "dsv3").mkdir(exist_ok=True)
(out / "dsv3" / "config.json").write_text(json.dumps(
    {**preset_hf_config("tiny-deepseek-v3"), "vocab_size": 49152, "max_position_embeddings": 4096}))
EOF
run() {  # run MODEL_NAME METHOD SPEC_JSON SERVE_ARGS... -- BENCH_ARGS...
  local name=$1 method=$2 spec=$3; shift 3
  local serve=() bench=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do serve+=("$1"); shift; done
  shift
  bench=("$@")
  local extra=()
  [ -n "$spec" ] && extra=(--speculative-config "$spec")
  lightspeed serve "${serve[@]}" --port 8012 --max-num-seqs 4 "${extra[@]}" > "$out/serve_${name}_$method.log" 2>&1 &
  local server=$!
  for i in $(seq 300); do curl -sf localhost:8012/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
  echo "$name $method ready after ${i}s"
  lightspeed-bench agentic --base-url http://127.0.0.1:8012 --no-progress --cache-page-size 16 --concurrency 1 \
    --max-duration "$secs" --request-timeout 300 --output-dir "$out" --name "spec_heads_${name}_$method" \
    --label "cpu $name $method" "${bench[@]}" 2>&1 | tail -3
  curl -s localhost:8012/metrics | grep -E "^lightspeed:spec_decode" > "$out/metrics_${name}_$method.txt" || true
  cat "$out/metrics_${name}_$method.txt"
  kill $server; wait $server
}
eagle='{"method": "eagle3", "num_speculative_tokens": 3, "model": "'"$out"'/eagle3_head"}'
mtp='{"method": "mtp", "num_speculative_tokens": 2}'
run smol none "" --max-model-len 8192 -- --trace "$trace"
run smol eagle3 "$eagle" --max-model-len 8192 -- --trace "$trace"
dsv3=("$out/dsv3" --load-format dummy --tokenizer "$smol" --max-model-len 4096)
random=(--tokenizer "$smol" --mode random --input-tokens 512 --output-tokens 64)
run dsv3 none "" "${dsv3[@]}" -- "${random[@]}"
run dsv3 mtp "$mtp" "${dsv3[@]}" -- "${random[@]}"
