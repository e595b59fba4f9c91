#!/usr/bin/env bash
# FlashInfer's MLA sources for the H200. tools/bench/h200/flashinfer_wheel.sh strips flashinfer-python to
# the sources of paged decode / prefill / sampling; FlashInfer's MLA JIT modules (FA2, and FA3 on sm_90)
# build from data/csrc/batch_mla_* (7 files, ~22 KB), which that tree leaves out. This carries them beside it.
#   bash mla/scripts/flashinfer_mla_sources.sh pack     # HERE, from the checkout root: .flashinfer/mla-csrc.tar.gz
#   bash mla/scripts/flashinfer_mla_sources.sh install  # ON the H200, after `source tools/bench/h200/flashinfer_setup.sh`
# The tarball sits in .flashinfer/ (git-ignored), so carry [".flashinfer"] takes it with the stripped parts.
set -euo pipefail
version=0.7.2.post1
tarball=.flashinfer/mla-csrc.tar.gz
files=(batch_mla_binding.cu batch_mla_config.jinja batch_mla_plan.cu batch_mla_run.cu
       batch_mla_sm90_binding.cu batch_mla_sm90_plan.cu batch_mla_sm90_run.cu)
fail() { echo "flashinfer_mla_sources: $*" >&2; exit 1; }
[ -d mla ] && [ -d tools/bench ] || fail "run from the checkout root"
case "${1:-}" in
pack)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --no-deps -d "$work" "flashinfer-python==$version" 2>&1 | grep -v "^WARNING" || true
  mkdir -p "$work/csrc" .flashinfer
  python3 - "$work/csrc" "$work"/flashinfer_python-"$version"-*.whl "${files[@]}" <<'PY'
import pathlib, sys, zipfile

dest, wheel, names = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for name in names:
        (dest / name).write_bytes(z.read(f"flashinfer/data/csrc/{name}"))  # KeyError: not in this wheel
PY
  tar -C "$work/csrc" -czf "$tarball" "${files[@]}"
  echo "$tarball: ${#files[@]} files, $(stat -c %s "$tarball") bytes, sha256 $(sha256sum "$tarball" | cut -d' ' -f1)"
  ;;
install)
  site=${FI_SITE:-/tmp/fi-site}
  [ -f "$site/.ready" ] || fail "no FlashInfer tree at $site: source tools/bench/h200/flashinfer_setup.sh first"
  [ -f "$tarball" ] || fail "no $tarball carried (make it here: bash mla/scripts/flashinfer_mla_sources.sh pack)"
  tar -xzf "$tarball" -C "$site/flashinfer/data/csrc"
  for f in "${files[@]}"; do [ -f "$site/flashinfer/data/csrc/$f" ] || fail "$f missing after extraction"; done
  echo "FlashInfer MLA sources installed into $site/flashinfer/data/csrc"
  ;;
*)
  fail "usage: bash mla/scripts/flashinfer_mla_sources.sh pack|install"
  ;;
esac
