#!/usr/bin/env bash
# On the H200 (device kit installed): the kernel-level picture in one call, each part time-boxed.
#   bash tools/bench/h200/kernels_profile.sh OUTDIR [MLA_BUDGET_S|0] [BASELINE_PACKAGE_DIR]
# 1. GPU tests of the attention kernels (prefill tiles of every size the chooser picks),
# 2. paged prefill attention: tile sweep vs torch SDPA (tools/bench/prefill_attention.py), and an
#    earlier kernel package copy beside it when BASELINE_PACKAGE_DIR is given (the before of a change),
# 3. the engine's step profile: batch-1 / 32 decode, a 20K first turn, an 800-token turn (profile_gpu.py),
# 4. MLA decode against its roofline (tools/bench/mla.py, time-boxed by MLA_BUDGET_S; 0 skips it).
set -uo pipefail
out=$(realpath -m "$1") mla_budget=${2:-100} baseline=${3:-}
mkdir -p "$out"
timeout 90 python3 -m pytest -q -m gpu kernel/tests/triton/test_attention.py -p no:cacheprovider \
  > "$out/attention_gpu_tests.log" 2>&1; echo "attention gpu tests rc=$? $(tail -1 "$out/attention_gpu_tests.log")"
[ -n "$baseline" ] && baseline=(--baseline "$(realpath "$baseline")") || baseline=()
cd tools/bench
timeout 200 python3 prefill_attention.py --out "$out" "${baseline[@]}" 2>&1 | tail -12
timeout 150 python3 profile_gpu.py --out "$out" 2>&1 | grep -v "^USDT\|^STAGE\|SyncActivity" | tail -6
[ "$mla_budget" -gt 0 ] && timeout $((mla_budget + 40)) python3 mla.py --out "$out" --budget-s "$mla_budget" 2>&1 | tail -8
exit 0
