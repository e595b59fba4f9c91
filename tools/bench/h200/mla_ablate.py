#!/usr/bin/env python3
"""Where an FP8-MMA MLA tile's time goes, by ablation: timing-only copies of the kernel, each with one part of the
tile loop cut out, benched beside the intact kernel (their outputs are wrong by construction; the bench's
`err` column says how wrong, and nothing else reads them).

    python3 tools/bench/h200/mla_ablate.py --out OUT [--ablations all|name,name] [--points seeds]

Each ablation is an exact-text edit of the FP8-MMA kernel (KERNEL_FILES) in a copy of mla/ under
/tmp (an edit whose text is gone fails loudly rather than timing the intact kernel); the copies build in
parallel (nvcc, one process each, own kernel cache), then tools/bench/mla.py times
`mla_decode_sm90_fp8mma` in each, one after another, into OUT/<name>/. Run on the device from the checkout
root after `source .whl/setup_on_device.sh`. The intact kernel runs first and last (`intact`, `intact2`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

KERNEL = "lightspeed_mla/cuda/mla_decode_sm90_fp8mma.cu"
KERNEL_FILES = (KERNEL, "lightspeed_mla/cuda/sm90_decode_tile.cuh")  # an edit's text is in one of them, once
LDSM = "      ldmatrix_x4_trans(lat + swizzled_offset_8bit(32 * ks + lane, 256 * wg + 64 * c + 16 * warp), d);\n"
PERMS = ("      a[c][ks][0] = __byte_perm(d[0], d[1], 0x6240);\n      a[c][ks][1] = __byte_perm(d[0], d[1], 0x7351);\n"
         "      a[c][ks][2] = __byte_perm(d[2], d[3], 0x6240);\n      a[c][ks][3] = __byte_perm(d[2], d[3], 0x7351);\n")
# name -> (what it cuts, [(old, new), ...])
ABLATIONS = {
    "no_v_ldmatrix": ("the P V fragments' ldmatrix.trans reads of the latent tile (the byte permutes stay, on the "
                      "read's address as data)",
                      [(LDSM, "      d[0] = d[1] = d[2] = d[3] = lat + swizzled_offset_8bit(32 * ks + lane, 256 * wg + "
                              "64 * c + 16 * warp);\n")]),
    "no_v_frags": ("the whole P V fragment build (ldmatrix.trans and byte permutes; P V runs on the read's address "
                   "as its A)",
                   [(LDSM + PERMS, "      a[c][ks][0] = a[c][ks][1] = a[c][ks][2] = a[c][ks][3] =\n"
                                   "          lat + swizzled_offset_8bit(32 * ks + lane, 256 * wg + 64 * c + 16 * warp);\n")]),
    "quarter_s_latent": ("3/4 of S_latent's e4m3 wgmmas (4 of 16 k-steps stay)",
                         [("  for (int k = 0; k < 8; ++k) {\n    const uint32_t koff = (k >> 2) * kBlockBytes + (k & 3) * 32;\n"
                           "    wgmma_m64n32k32_e4m3(s_lat0",
                           "  for (int k = 0; k < 2; ++k) {\n    const uint32_t koff = (k >> 2) * kBlockBytes + (k & 3) * 32;\n"
                           "    wgmma_m64n32k32_e4m3(s_lat0"),
                          ("  for (int k = 8; k < 16; ++k) {", "  for (int k = 8; k < 10; ++k) {")]),
    "no_row_max_barrier": ("the consumers' barrier inside the row-max exchange (each warpgroup then reads the other's "
                           "maximum from whenever it was last written)",
                           [("  named_barrier_sync(1, kConsumerThreads);\n  mx[0] = fmaxf(red_max[f.r_lo]",
                             "  mx[0] = fmaxf(red_max[f.r_lo]")]),
    "no_step_barrier": ("the consumers' barrier at the end of each tile step (P of the next tile and the rows' "
                        "accumulator factors are then read without waiting for the other warps' writes)",
                        [("    fence_proxy_async();  // P of tile it + 1 before wgmma reads it\n"
                          "    named_barrier_sync(1, kConsumerThreads);\n",
                          "    fence_proxy_async();  // P of tile it + 1 before wgmma reads it\n")]),
    "no_rescale": ("the accumulator's rescale after each step (its 128 multiplies and the factors' shared-memory "
                   "reads)",
                   [("    rescale_acc(acc, red_rescale, moved, f.lane);\n", "")]),
    "no_pv": ("the P V wgmmas (an empty group is committed in their place, so wgmma_wait<1> still waits for S; the "
              "fragments' ldmatrix reads stay)",
              [("    issue_pv_e4m3(acc, a, base + p_tile(it));\n", "    wgmma_commit();\n")]),
}


def make_copy(name: str, edits: list[tuple[str, str]], root: Path, base: Path = Path("/tmp/mla-ablate")) -> Path:
    """A copy of root/mla under base/name with `edits` applied to the kernel; returns its mla/ folder."""
    dst = base / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(root / "mla", dst / "mla", ignore=shutil.ignore_patterns("__pycache__", "tests"))
    texts = {f: (dst / "mla" / f).read_text() for f in KERNEL_FILES}
    for old, new in edits:
        where = {f: t.count(old) for f, t in texts.items() if old in t}
        if list(where.values()) != [1]:
            raise SystemExit(f"{name}: the text to cut is not in the kernel once ({where}): {old[:60]!r}")
        f = next(iter(where))
        texts[f] = texts[f].replace(old, new)
    for f, text in texts.items():
        (dst / "mla" / f).write_text(text)
    return dst / "mla"


def env_for(src: Path, name: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{src}:{env.get('PYTHONPATH', '')}"
    env["LIGHTSPEED_KERNEL_CACHE_DIR"] = f"/tmp/mla-ablate-cache/{name}"
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ablations", default="all")
    ap.add_argument("--points", default="seeds", choices=("seeds", "small"))
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    root = Path.cwd()
    names = list(ABLATIONS) if args.ablations == "all" else args.ablations.split(",")
    copies = {"intact": make_copy("intact", [], root)}
    for name in names:
        copies[name] = make_copy(name, ABLATIONS[name][1], root)
    t0 = time.time()
    build = "from lightspeed_mla import sm90; sm90.load_extension()"
    procs = {n: subprocess.Popen([sys.executable, "-c", build], env=env_for(src, n), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True) for n, src in copies.items()}
    for n, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        if proc.returncode:
            print(f"{n}: build failed\n{err[-2000:]}")
            return 1
    print(f"built {len(procs)} copies in {time.time() - t0:.0f}s")
    args.out.mkdir(parents=True, exist_ok=True)
    for run in ["intact", *names, "intact2"]:
        name = "intact" if run == "intact2" else run
        cmd = [sys.executable, "mla.py", "--out", str(args.out / run), "--candidates", "mla_decode_sm90_fp8mma",
               "--points", args.points, "--skip-prefill", "--budget-s", "60", "--commit", f"{args.commit} {run}"]
        done = subprocess.run(cmd, cwd=root / "tools" / "bench", env=env_for(copies[name], name), capture_output=True,
                              text=True, timeout=300)
        (args.out / f"{run}.log").write_text(done.stdout + done.stderr)
        what = "intact kernel" if name == "intact" else "cut: " + ABLATIONS[name][0]
        print(f"== {run} ({what}): rc={done.returncode}")
        for md in sorted((args.out / run).glob("mla_bench_*.md")):
            for line in md.read_text().splitlines():
                if line.startswith("| mla_decode"):
                    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
