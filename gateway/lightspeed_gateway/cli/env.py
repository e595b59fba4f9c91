"""`lightspeed env`: versions, devices, and which kernel the registry picks per op family."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

PACKAGES = ("lightspeed", "lightspeed-gateway", "lightspeed-kernel", "lightspeed-scheduler", "lightspeed-mla",
            "torch", "triton", "transformers", "tokenizers", "xgrammar", "fastapi", "uvicorn", "pydantic",
            "pyzmq", "msgspec", "gguf", "flashinfer-python", "sgl-deep-gemm")


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="print versions, devices and the kernels the registry would pick")
    p.add_argument("--dtype", default=None, help="activation dtype for the kernel choice (default: the "
                   "engine's: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--explain", action="store_true", help="list every candidate kernel with its rank or why "
                   "it was rejected, not only the pick")
    p.set_defaults(func=run, command_parser=p)


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _physical_cores() -> str:
    # The engine core runs one torch thread per physical core on the CPU (engine/README.md).
    try:
        import psutil  # an engine dependency
    except ImportError:
        return ""
    physical = psutil.cpu_count(logical=False)
    return f", {physical} physical (the engine's default CPU threads)" if physical else ""


def devices_lines() -> list[str]:
    lines = [f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores{_physical_cores()}"]
    try:
        import torch
    except ImportError:
        return lines + ["torch: not installed"]
    lines.append(f"torch threads: {torch.get_num_threads()}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append(f"cuda:{i}: {props.name}, sm_{props.major}{props.minor}, "
                         f"{props.total_memory / 2**30:.1f} GiB")
    else:
        lines.append("cuda: not available")
    return lines


def kernel_lines(dtype: str | None, explain_all: bool) -> list[str]:
    try:
        import lightspeed_kernel as lk
    except ImportError as e:
        return [f"lightspeed_kernel not importable: {e}"]
    platform_now = lk.current_platform()
    if dtype is None:
        dtype = "float32" if platform_now.is_cpu else "bfloat16"
    lines = [f"platform: {platform_now}   dtype: {dtype}   triton kernels: {lk.TRITON_AVAILABLE}"]
    pairs = sorted({(spec.family, spec.mode) for spec in lk.list_kernels()})
    for family, mode in pairs:
        result = lk.explain(family, mode, dtype)
        if explain_all:
            lines.append(str(result))
            continue
        pick = result.selected or f"none ({result.error})"
        forced = f"  [override from {result.override[1]}]" if result.override else ""
        lines.append(f"  {family + '/' + mode:<28} -> {pick}{forced}")
    return lines


def run(args: argparse.Namespace) -> int:
    print(f"python: {sys.version.split()[0]} ({sys.executable})")
    print(f"platform: {platform.platform()}")
    print("packages:")
    for dist in PACKAGES:
        print(f"  {dist:<22} {_version(dist)}")
    print("devices:")
    for line in devices_lines():
        print(f"  {line}")
    print("kernels (what the registry picks on this machine):")
    for line in kernel_lines(args.dtype, args.explain):
        print(line)
    return 0
