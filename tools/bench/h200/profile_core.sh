#!/usr/bin/env bash
# Samples a running `lightspeed serve` (or any server) while it works: waits until the GPU reports
# work (a bench builds and tokenises its prompts first, GPU idle), DELAY seconds more, then runs
# `nvidia-smi dmon` and, when a Lightspeed engine core is running, py-spy on it, both for SECONDS.
#   bash tools/bench/h200/profile_core.sh OUTDIR NAME [DELAY=4] [SECONDS=10] &
# Writes OUTDIR/NAME_dmon.txt, OUTDIR/NAME_pyspy.txt (raw, for flamegraph.pl) and NAME_pyspy.log.
set -uo pipefail
out=$1 name=$2 delay=${3:-4} secs=${4:-10}
sleep 2  # utilization.gpu averages the last second: let the previous level's work drop out of it
for _ in $(seq 240); do
  busy=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | head -1)
  [ "${busy:-0}" -gt 0 ] && break; sleep 0.5
done
sleep "$delay"
# Anchored on the interpreter: an unanchored `pgrep -f lightspeed.core.engine_core` also matches any
# shell whose command line names it (a `bash -c` wrapping these lines, say).
core=$(pgrep -f '^\S*python\S* -m lightspeed[.]core[.]engine_core' | head -1)
nvidia-smi dmon -s u -c "$secs" > "$out/${name}_dmon.txt" 2>&1 &
if [ -n "$core" ]; then
  py-spy record -p "$core" -d "$secs" -r 200 -f raw --nonblocking -o "$out/${name}_pyspy.txt" > "$out/${name}_pyspy.log" 2>&1
fi
wait
