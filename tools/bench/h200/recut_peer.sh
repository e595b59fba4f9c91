#!/usr/bin/env bash
# Re-cut the vLLM wheel set of ../shared/peers/vllm/prepare.sh (.peer/wheels) into parts that fit one
# device call beside this checkout's tracked files. The 64 MiB carry counts them, and more than their bytes: on
# 2026-12-07 a 33.9 MB tree (git ls-files | xargs du -cb) with a 32.0 MB part (66.0 MB of the 67.1) was refused.
# The tree was 37.0 MB after that night's results, so the default is now 24 MB parts (18 of them). A part call
# takes under a second of wall time on a warm machine. Check before a lease: `git ls-files | xargs du -cb |
# tail -1` + the largest part, with a few MB to spare.
# install_on_device.sh puts split wheels back together from NAME.whl.partaa, partab, ... as before.
#   bash tools/bench/h200/recut_peer.sh [PART_BYTES=24000000]    # prints the number of parts
set -euo pipefail
limit=${1:-24000000}; piece=$((limit - 1000000)); out=.peer
[ -d "$out/wheels" ] || { echo "no $out/wheels: run ../shared/peers/vllm/prepare.sh first" >&2; exit 1; }
rm -rf "$out"/part* "$out/stage"; mkdir -p "$out/stage"
(cd "$out/wheels" && sha256sum -- *) > "$out/stage/SHA256SUMS"
for f in "$out"/wheels/*; do
  b=$(basename "$f")
  if [ "$(stat -c %s "$f")" -gt "$piece" ]; then split -b "$piece" "$f" "$out/stage/$b.part"; else cp "$f" "$out/stage/$b"; fi
done
n=1; size=0; mkdir -p "$out/part1"
for f in $(ls -S "$out"/stage/* | grep -v SHA256SUMS); do
  s=$(stat -c %s "$f")
  if (( size + s > limit )); then n=$((n + 1)); size=0; mkdir -p "$out/part$n"; fi
  mv "$f" "$out/part$n/"; size=$((size + s))
done
n=$((n + 1)); mkdir -p "$out/part$n"
mv "$out/stage/SHA256SUMS" "$out/part$n/"; cp ../shared/peers/vllm/install_on_device.sh "$out/part$n/"; rmdir "$out/stage"
du -sh "$out"/part* | sed 's/^/  /'; echo "$n parts in $out; install_on_device.sh is in part$n"
