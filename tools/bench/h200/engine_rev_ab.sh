#!/usr/bin/env bash
# An A/B of the engine (and the kernel package) between this checkout and an earlier commit, in one lease:
# engine_gpu.py's batch-1 step and 32-concurrent throughput (llama-3.1-8b preset, 1K prompts, CUDA graphs),
# this tree, REV's engine + kernel, this tree again (the repeat shows the run-to-run spread).
#   here:       bash tools/bench/h200/engine_rev_ab.sh pack REV       -> .whl/eng-REV.tar (git archive)
#   on device:  source .whl/setup_on_device.sh; bash tools/bench/h200/engine_rev_ab.sh run REV OUTDIR
# REV's packages go first on PYTHONPATH (the engine core process inherits it); the scheduler wheel and
# everything else are this tree's. PYSPY=1 adds a py-spy record (raw, all processes, idle included) of a
# batch-1-only run of this tree (512 decoded tokens): where the engine core's host time goes at batch 1.
set -uo pipefail
cmd=${1:?usage: engine_rev_ab.sh pack REV | run REV OUTDIR}
rev=${2:?a commit}
case $cmd in
  pack)
    mkdir -p .whl
    git archive "$rev" engine kernel > ".whl/eng-$rev.tar"
    echo ".whl/eng-$rev.tar: $(wc -c < ".whl/eng-$rev.tar") bytes"
    ;;
  run)
    out=$(realpath -m "${3:?an output folder}")
    old=/tmp/eng-ab-$rev
    rm -rf "$old" && mkdir -p "$old" "$out" && tar -xf ".whl/eng-$rev.tar" -C "$old" || exit 1
    cd tools/bench || exit 1
    for run in new old new2; do
      path=${PYTHONPATH:-}
      [[ $run == old ]] && path=$old/engine:$old/kernel${PYTHONPATH:+:$PYTHONPATH}
      mkdir -p "$out/$run"
      t0=$SECONDS
      PYTHONPATH=$path timeout 240 python3 engine_gpu.py --no-hf --no-eager-compare --batches 32 --out "$out/$run" \
        > "$out/$run.log" 2>&1
      echo "== $run: rc=$? in $((SECONDS - t0))s: $(grep -E '\] batch 1:' "$out/$run.log" | head -1)"
      grep -E 'concurrent|tok/s' "$out/$run.log" | grep -v 'batch 1:' | head -2
    done
    if [[ ${PYSPY:-0} == 1 ]]; then
      py-spy record --subprocesses --idle -r 200 -f raw -o "$out/pyspy_batch1.txt" -- \
        python3 engine_gpu.py --no-hf --no-eager-compare --batches 1 --decode-len 512 --out "$out/pyspy_run" \
        > "$out/pyspy_batch1.log" 2>&1
      echo "== py-spy: rc=$?, $(wc -l < "$out/pyspy_batch1.txt" 2>/dev/null) stacks"
    fi
    ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
