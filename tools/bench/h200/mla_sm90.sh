#!/usr/bin/env bash
# On the H200, from the checkout root, after `source .whl/setup_on_device.sh && source tools/bench/h200/flashinfer_setup.sh`
# (the latter puts ninja on PATH, which torch's JIT build needs):
#   bash tools/bench/h200/mla_sm90.sh OUTDIR
# The sm_90a CUDA MLA decode kernel (mla/lightspeed_mla/sm90.py, issue 15), each part time-boxed (worst case
# ~445 s, typically ~250 s):
#   1. JIT build (nvcc, sm_90a) -> OUTDIR/build.log with ptxas' registers / spills / shared memory; a failed
#      build prints nvcc's errors and stops here (exit 0);
#   2. its GPU tests against mla_decode_reference (every case prints max abs / rel error) -> OUTDIR/tests.log;
#   3. tools/bench/mla.py with mla_decode_triton, mla_decode_sm90, (FP8 points) mla_decode_sm90_fp8qk and
#      mla_decode_sm90_fp8mma (both products on e4m3 MMAs) and, when
#      flashinfer imports, (bf16 points) mla_decode_flashinfer side by side on the seeds' case and a 16-point
#      grid (--points small) -> OUTDIR/mla_bench_*.{md,json}, bench.log. MLA_CANDIDATES overrides the list;
#      MLA_NO_FLASHINFER=1 leaves FlashInfer out (its MLA JIT build costs ~75 s of a lease).
# Skips the bench when the tests timed out before any kernel call returned (a hung kernel would hang it too).
set -uo pipefail
out=$(realpath -m "${1:?usage: mla_sm90.sh OUTDIR}")
mkdir -p "$out"
export PYTHONPATH=$PWD/mla${PYTHONPATH:+:$PYTHONPATH}  # this checkout's lightspeed_mla, cuda/ sources included
export LIGHTSPEED_KERNEL_CACHE_DIR=${LIGHTSPEED_KERNEL_CACHE_DIR:-/tmp/lightspeed-kernels}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
commit=${MLA_SM90_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "mla_sm90: commit $commit, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), nvcc $(nvcc --version 2>/dev/null | tail -1)"

t0=$SECONDS
timeout 120 python3 - > "$out/build.log" 2>&1 <<'EOF'
import time
t = time.time()
from lightspeed_mla import sm90
print("availability:", sm90.availability())
ext = sm90.load_extension(verbose=True)
print(f"built in {time.time() - t:.1f}s; dynamic shared memory per CTA: bf16 {ext.smem_bytes()} B, "
      f"fp8 {ext.fp8_smem_bytes(False)} B, fp8qk {ext.fp8_smem_bytes(True)} B, "
      f"fp8mma {ext.fp8_smem_bytes(True, True)} B")
EOF
rc=$?
echo "build rc=$rc in $((SECONDS - t0))s"
grep -E "availability|built in|registers|spill|stack frame|serialized" "$out/build.log" | sed 's/^/  /' | head -12
if [[ $rc != 0 ]]; then
  echo "BUILD FAILED; the compiler's errors:"
  grep -E -A3 "error|Error" "$out/build.log" | head -60
  tail -15 "$out/build.log"
  exit 0
fi

t0=$SECONDS
timeout 170 python3 -m pytest -q -s -rfE mla/tests/test_sm90_gpu.py -p no:cacheprovider > "$out/tests.log" 2>&1
trc=$?
echo "gpu tests rc=$trc in $((SECONDS - t0))s: $(tail -1 "$out/tests.log")"
grep -oE "sm90 .*" "$out/tests.log" | sed 's/^/  /' | head -80
[[ $trc != 0 ]] && grep -E -B2 -A25 "^(FAILED|ERROR)|Error|assert" "$out/tests.log" | head -60
if [[ $trc == 124 ]] && ! grep -q "sm90 " "$out/tests.log"; then
  echo "tests timed out before any kernel call returned (a hang?): bench skipped"
  exit 0
fi

t0=$SECONDS
candidates=mla_decode_triton,mla_decode_sm90,mla_decode_sm90_fp8qk,mla_decode_sm90_fp8mma
if [[ $trc == 124 ]]; then  # the fp8mma tests run last: a hang there would hang its bench points too
  echo "tests timed out: mla_decode_sm90_fp8mma left out of the bench"
  candidates=${candidates%,mla_decode_sm90_fp8mma}
fi
[[ ${MLA_NO_FLASHINFER:-0} == 1 ]] || ! python3 -c "import flashinfer" 2>/dev/null || candidates=$candidates,mla_decode_flashinfer
(cd tools/bench && timeout 150 python3 mla.py --out "$out" --candidates "${MLA_CANDIDATES:-$candidates}" \
  --points small --skip-prefill --budget-s 100 --commit "$commit") > "$out/bench.log" 2>&1
echo "bench rc=$? in $((SECONDS - t0))s"
md=$(ls -t "$out"/mla_bench_*.md 2>/dev/null | head -1)
if [[ -n $md ]]; then
  grep -E "^\| (kernel|mla_decode)" "$md" | head -50
else
  tail -20 "$out/bench.log"
fi
exit 0
