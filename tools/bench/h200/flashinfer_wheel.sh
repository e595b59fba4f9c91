#!/usr/bin/env bash
# HERE (a machine with PyPI, not the device): FlashInfer for the H200, stripped to what paged decode /
# prefill (FA2, FA3 on sm_90) and sampling compile from, in carry-sized parts under .flashinfer/.
#   bash tools/bench/h200/flashinfer_wheel.sh            # from the checkout root
# Downloads flashinfer-python 0.7.2.post1 (62 MB, ~426 MB unpacked: mostly the JIT sources of kernels
# we never build, data/csrc/* for MoE, KDA, DSv4, ...) and the wheels `import flashinfer` and its JIT
# need that the H200 image (torch 2.11 cu130, triton 3.6, nvcc 13, cmake) lacks: apache-tvm-ffi (its
# headers and library link every JIT module), nvidia-ml-py (pynvml, imported at import), ninja (the
# JIT's build tool). Keeps of data/csrc the top-level decode / prefill / single-request / sampling
# sources, the headers, and whatever they include; of data/cutlass and data/cccl the include trees
# FlashInfer's JIT puts on its -I path. Writes .flashinfer/flashinfer-site.tar.gz.part-NN (at most
# 60 MiB each) and .flashinfer/MANIFEST (sizes, sha256). The device side: flashinfer_setup.sh.
set -euo pipefail
version=0.7.2.post1
deps=(apache-tvm-ffi==0.1.15.post2 nvidia-ml-py==13.615.71 ninja==1.13.2)
out=.flashinfer
[ -d kernel ] && [ -d tools/bench ] || { echo "run from the checkout root" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/wheels" "$work/site"
py_platform=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
             --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
             --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps -d "$work/dl" "flashinfer-python==$version" 2>&1 | grep -v "^WARNING" || true
python3 -m pip download -q --no-deps "${py_platform[@]}" -d "$work/wheels" "${deps[@]}" 2>&1 | grep -v "^WARNING" || true
wheel=$(ls "$work"/dl/flashinfer_python-"$version"-*.whl)
python3 - "$wheel" "$work/site" <<'EOF'
import fnmatch, pathlib, re, sys, zipfile

wheel, site = sys.argv[1], pathlib.Path(sys.argv[2])
CSRC = "flashinfer/data/csrc/"
KEEP_CSRC = ["batch_decode.cu", "batch_decode_jit_binding.cu", "batch_decode_customize_config.jinja",
             "batch_decode_kernel_inst.jinja", "batch_prefill*", "single_decode*", "single_prefill*",
             "sampling.cu", "renorm.cu", "flashinfer_sampling_binding.cu", "cascade.cu", "page.cu", "logging.cc",
             "*.h"]
KEEP_DATA = ["flashinfer/data/include/", "flashinfer/data/spdlog/", "flashinfer/data/cutlass/include/",
             "flashinfer/data/cutlass/tools/util/include/", "flashinfer/data/cccl/cub/",
             "flashinfer/data/cccl/libcudacxx/include/", "flashinfer/data/cccl/thrust/"]
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    top = {n[len(CSRC):]: n for n in names if n.startswith(CSRC) and "/" not in n[len(CSRC):]}
    keep = {f for f in top if any(fnmatch.fnmatch(f, p) for p in KEEP_CSRC)}
    todo = list(keep)
    while todo:  # quoted includes of kept sources that are themselves csrc files
        for inc in re.findall(r'#include\s+"([^"]+)"', z.read(top[todo.pop()]).decode(errors="replace")):
            if inc in top and inc not in keep:
                keep.add(inc)
                todo.append(inc)
    kept = dropped = 0
    for n in names:
        data = n.startswith("flashinfer/data/")
        if n.startswith(CSRC):
            ok = n[len(CSRC):] in keep
        elif data:
            ok = any(n.startswith(p) for p in KEEP_DATA) or n.count("/") == 2  # data/*.py stay
        else:
            ok = "/__pycache__/" not in n
        if ok:
            z.extract(n, site)
            kept += z.getinfo(n).file_size
        else:
            dropped += z.getinfo(n).file_size
print(f"flashinfer {pathlib.Path(wheel).name}: kept {kept / 2**20:.0f} MiB, stripped {dropped / 2**20:.0f} MiB; "
      f"csrc kept {len(keep)} of {len(top)} top-level files")
EOF
cp "$work"/wheels/*.whl "$work/site/"
rm -f "$out"/flashinfer-site.tar.gz.part-*
tar -C "$work/site" -czf "$work/flashinfer-site.tar.gz" .
split -b 60M -d -a 2 "$work/flashinfer-site.tar.gz" "$out/flashinfer-site.tar.gz.part-"
{
  echo "flashinfer-python $version stripped, with ${deps[*]}"
  echo "tarball $(stat -c %s "$work/flashinfer-site.tar.gz") bytes sha256 $(sha256sum "$work/flashinfer-site.tar.gz" | cut -d' ' -f1)"
  echo "unpacked $(du -sb "$work/site" | cut -f1) bytes"
  for p in "$out"/flashinfer-site.tar.gz.part-*; do echo "$(basename "$p") $(stat -c %s "$p") bytes"; done
} > "$out/MANIFEST"
cat "$out/MANIFEST"
echo "carry: $(cd "$out" && ls flashinfer-site.tar.gz.part-* | sed 's|^|.flashinfer/|' | paste -sd' ') .flashinfer/MANIFEST"
