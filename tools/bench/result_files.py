"""Where benchmark results go: one stem per run, named by UTC date-time and device, so a run never
overwrites an earlier one, and the commit measured recorded inside. Shared by the scripts here."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from pathlib import Path


def git_commit() -> str:
    """Short hash of HEAD, with "+dirty" when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def device_name() -> str:
    """The CUDA device's name when one is visible, else the CPU's."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def result_stem(out_dir: str | Path, name: str, device: str | None = None) -> Path:
    """out_dir/<name>_<YYYY-MM-DD_HHMMSS>_<device>; the caller adds .json / .md."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d_%H%M%S")
    slug = "".join(c if c.isalnum() else "-" for c in (device or device_name()).lower()).strip("-")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{name}_{stamp}_{slug}"
