#!/usr/bin/env bash
# On the H200, from the checkout root, with .flashinfer/ carried (made here by flashinfer_wheel.sh):
#   bash tools/bench/h200/flashinfer.sh OUTDIR [tests|prefill|decode|all]
# FlashInfer beside our Triton kernels, each part time-boxed: 1. the GPU tests of the FlashInfer
# backend (real kernels vs the reference; the first run JIT-compiles every configuration with nvcc),
# 2. paged prefill TFLOP/s with FlashInfer auto (FA3 on sm_90) and FA2 columns (prefill_attention.py
# --flashinfer --no-sweep), 3. the decode table of kernels.py with FlashInfer columns (--quick
# --no-sweep; its elementwise and MoE sections run too). JIT builds go to /tmp/fi-cache: a warm
# machine reuses them, a fresh one compiles again.
set -uo pipefail
out=$(realpath -m "$1") what=${2:-all}
mkdir -p "$out"
source tools/bench/h200/flashinfer_setup.sh || exit 1
if [[ $what == tests || $what == all ]]; then
  timeout 480 python3 -m pytest -q -m gpu kernel/tests/test_flashinfer.py -p no:cacheprovider \
    > "$out/flashinfer_gpu_tests.log" 2>&1; echo "flashinfer gpu tests rc=$? $(tail -1 "$out/flashinfer_gpu_tests.log")"
fi
cd tools/bench
if [[ $what == prefill || $what == all ]]; then
  timeout 400 python3 prefill_attention.py --out "$out" --no-sweep --flashinfer 2>&1 | tail -12
fi
if [[ $what == decode || $what == all ]]; then
  timeout 500 python3 kernels.py --out "$out" --quick --no-sweep --flashinfer 2>&1 | grep -i "^decode\|fail\|error" | tail -30
fi
exit 0
