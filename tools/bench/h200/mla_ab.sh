#!/usr/bin/env bash
# An A/B of the MLA decode kernels between this checkout and an earlier commit, in one lease, same command.
#   here:       bash tools/bench/h200/mla_ab.sh pack REV          -> .whl/mla-REV.tar (git archive of mla/)
#   on device:  source .whl/setup_on_device.sh; bash tools/bench/h200/mla_ab.sh run REV OUTDIR [POINTS] [CANDIDATES]
# Runs tools/bench/mla.py three times, this tree, REV's mla/, this tree again (the repeat shows the run-to-run
# spread), into OUTDIR/{new,old,new2}; REV's build gets a kernel cache of its own, this tree's is mla_sm90.sh's
# (the JIT module names hash the sources, so a build left by mla_sm90.sh is reused). POINTS: seeds (default) |
# small; CANDIDATES default mla_decode_sm90_fp8qk,mla_decode_sm90_fp8mma; MLA_AB_COMMIT names this tree's commit.
# Prints each run's rows.
set -uo pipefail
cmd=${1:?usage: mla_ab.sh pack REV | run REV OUTDIR [POINTS] [CANDIDATES]}
rev=${2:?a commit}
case $cmd in
  pack)
    mkdir -p .whl
    git archive "$rev" mla > ".whl/mla-$rev.tar"
    echo ".whl/mla-$rev.tar: $(wc -c < ".whl/mla-$rev.tar") bytes"
    ;;
  run)
    out=$(realpath -m "${3:?an output folder}")
    points=${4:-seeds}
    candidates=${5:-mla_decode_sm90_fp8qk,mla_decode_sm90_fp8mma}
    old=/tmp/mla-ab-$rev
    mkdir -p "$old" "$out"
    tar -xf ".whl/mla-$rev.tar" -C "$old" || exit 1
    here=${MLA_AB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo worktree)}  # the device copy has no .git
    for run in new old new2; do
      if [[ $run == old ]]; then src=$old/mla commit=$rev cache=/tmp/mla-ab-cache-old
      else src=$PWD/mla commit=$here cache=${LIGHTSPEED_KERNEL_CACHE_DIR:-/tmp/lightspeed-kernels}; fi
      t0=$SECONDS
      (cd tools/bench && PYTHONPATH=$src${PYTHONPATH:+:$PYTHONPATH} LIGHTSPEED_KERNEL_CACHE_DIR=$cache \
        timeout 200 python3 mla.py --out "$out/$run" --candidates "$candidates" --points "$points" --skip-prefill \
        --budget-s 60 --commit "$commit") > "$out/$run.log" 2>&1
      echo "== $run ($commit): rc=$? in $((SECONDS - t0))s"
      md=$(ls -t "$out/$run"/mla_bench_*.md 2>/dev/null | head -1)
      if [[ -n $md ]]; then grep -E "^\| (kernel|mla_decode)" "$md" | head -40; else tail -15 "$out/$run.log"; fi
    done
    ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
