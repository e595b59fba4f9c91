# ON the H200, sourced from the checkout root, with the parts of flashinfer_wheel.sh carried
# (carry [".flashinfer"] or each `.flashinfer/flashinfer-site.tar.gz.part-NN` plus .flashinfer/MANIFEST):
#   source tools/bench/h200/flashinfer_setup.sh
# Reassembles the parts, checks them against MANIFEST, installs the carried wheels (apache-tvm-ffi,
# nvidia-ml-py, ninja) and the stripped flashinfer tree into /tmp/fi-site (no index, no deps), and puts
# it first on PYTHONPATH and its bin/ (ninja) on PATH. Idempotent: a second source only re-exports.
# FLASHINFER_CUDA_ARCH_LIST=9.0a builds the JIT modules for the H200 only (and keeps `import flashinfer`
# from querying the device); its JIT cache goes to /tmp/fi-cache (lost with the machine: the first
# call of each kernel configuration compiles with nvcc, minutes for the prefill modules).
fi_site=/tmp/fi-site
_fi_fail() { echo "flashinfer setup: $*" >&2; return 1 2>/dev/null || exit 1; }
if [ ! -f "$fi_site/.ready" ]; then
  ls .flashinfer/flashinfer-site.tar.gz.part-* >/dev/null 2>&1 || _fi_fail "no .flashinfer parts carried" || return 1
  fi_tmp=$(mktemp -d)
  cat .flashinfer/flashinfer-site.tar.gz.part-* > "$fi_tmp/site.tar.gz"
  fi_want=$(sed -n 's/^tarball .* sha256 \([0-9a-f]*\)$/\1/p' .flashinfer/MANIFEST 2>/dev/null)
  fi_got=$(sha256sum "$fi_tmp/site.tar.gz" | cut -d' ' -f1)
  [ -z "$fi_want" ] || [ "$fi_want" = "$fi_got" ] || _fi_fail "parts do not match MANIFEST (missing a part?)" || return 1
  mkdir -p "$fi_tmp/x" "$fi_site"
  tar -xzf "$fi_tmp/site.tar.gz" -C "$fi_tmp/x" || _fi_fail "tar failed" || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$fi_site" \
    "$fi_tmp"/x/*.whl > /tmp/fi_pip.log 2>&1 || { tail -5 /tmp/fi_pip.log; _fi_fail "pip failed" || return 1; }
  rm -f "$fi_tmp"/x/*.whl
  cp -a "$fi_tmp"/x/. "$fi_site"/
  rm -rf "$fi_tmp"
  touch "$fi_site/.ready"
fi
export PYTHONPATH=$fi_site${PYTHONPATH:+:$PYTHONPATH} PATH=$fi_site/bin:$PATH
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-cache}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# A JIT cache brought back from an earlier lease (`tar czf OUT/jit-cache.tgz -C /tmp fi-cache` there, saved
# here as .flashinfer/jit-cache.tgz): same wheel, same image, so its builds load instead of compiling
# (2026-12-03: serve warm-up 5.8 s with it, 90 s without).
if [ -f .flashinfer/jit-cache.tgz ] && [ ! -d "$FLASHINFER_WORKSPACE_BASE/.cache" ] && [ "$FLASHINFER_WORKSPACE_BASE" = /tmp/fi-cache ]; then
  tar -xzf .flashinfer/jit-cache.tgz -C /tmp && echo "flashinfer: JIT cache restored from .flashinfer/jit-cache.tgz"
fi
python3 -c "import lightspeed_kernel" 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/kernel
python3 -c "import flashinfer, lightspeed_kernel.flashinfer as f; assert f.AVAILABLE, f.IMPORT_ERROR; print('flashinfer', flashinfer.__version__, 'ready; registered:', f.DECODE_KERNEL, f.PREFILL_KERNEL)" \
  || _fi_fail "import failed (a dependency the image lacks? see the traceback)" || return 1
ninja --version > /dev/null || _fi_fail "ninja not on PATH" || return 1
