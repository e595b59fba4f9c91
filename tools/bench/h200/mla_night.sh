#!/usr/bin/env bash
# One device call for the FP8-MMA kernel's open questions, each step time-boxed and its files packed into
# OUT/all.tgz as soon as it ends (a call cut short still returns what finished):
#   1. the sm90 GPU tests (73 cases against mla_decode_reference, build included) -> tests.log;
#   2. tools/bench/h200/mla_ab.sh: this tree's mla_decode_sm90_fp8mma against REV's (pack REV here first);
#   3. tools/bench/h200/mla_ablate.py: the intact kernel beside copies with one part of the tile cut out.
# Steps 2-3 are skipped when the tests time out (a hung kernel would hang them too).
#   on device: source .whl/setup_on_device.sh; bash tools/bench/h200/mla_night.sh OUT REV COMMIT [STEPS]
# STEPS: a comma list of tests, ab, ablate (default all three; ~560 s at most), for a lease short of time.
set -uo pipefail
out=$(realpath -m "${1:?usage: mla_night.sh OUT REV COMMIT [STEPS]}")
rev=${2:?an earlier commit, packed with mla_ab.sh pack}
commit=${3:?the commit of this tree}
steps=,${4:-tests,ab,ablate},
work=/tmp/mla-night
rm -rf "$work" && mkdir -p "$work" "$out"
pack() { tar czf "$out/all.tgz" -C "$work" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$work/gpu.txt"
export PYTHONPATH=$PWD/mla${PYTHONPATH:+:$PYTHONPATH} LIGHTSPEED_KERNEL_CACHE_DIR=/tmp/lightspeed-kernels
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
trc=0
if [[ $steps == *,tests,* ]]; then
  t0=$SECONDS
  timeout 200 python3 -m pytest -q -s -rfE mla/tests/test_sm90_gpu.py -p no:cacheprovider > "$work/tests.log" 2>&1
  trc=$?
  echo "tests rc=$trc in $((SECONDS - t0))s: $(tail -1 "$work/tests.log")"
  grep -E "^(FAILED|ERROR)" "$work/tests.log" | head
  pack
fi
[[ $trc == 124 ]] && { echo "tests timed out: A/B and ablations skipped"; exit 0; }
[[ $steps == *,ab,* ]] && MLA_AB_COMMIT=$commit timeout 170 bash tools/bench/h200/mla_ab.sh run "$rev" "$work/ab" seeds mla_decode_sm90_fp8mma \
  2>&1 | tee "$work/ab.log"
pack
[[ $steps == *,ablate,* ]] && timeout 190 python3 tools/bench/h200/mla_ablate.py --out "$work/ablate" --commit "$commit" 2>&1 | tee "$work/ablate.log"
pack
