#!/usr/bin/env bash
# On the H200: the batch-1 step with cuBLAS vs the skinny GEMM at one row, through the real engine
# (engine_ab.sh with LIGHTSPEED_KERNEL_OVERRIDE_GEMM_BF16). The faster choice goes to CHOICE_FILE
# (default /tmp/gemm_choice): `export LIGHTSPEED_KERNEL_OVERRIDE_GEMM_BF16=$(cat /tmp/gemm_choice)`.
#   bash tools/bench/h200/gemv_one_row_ab.sh OUTDIR COMMIT
CHOICE_FILE=${CHOICE_FILE:-/tmp/gemm_choice} exec bash "$(dirname "$0")/engine_ab.sh" "$1" "$2" \
  LIGHTSPEED_KERNEL_OVERRIDE_GEMM_BF16 cublas_linear triton_gemv_one_row
