"""Build and load the C kernels of ``csrc/``: once per machine and source version, with the system
C compiler, into a cache folder; bound with ctypes.

Why this shape: the kernel wheel stays pure Python (nothing to compile at install, nothing
platform-specific in the wheel), the code is compiled for the CPU it runs on (``-march=native``:
AVX2/FMA where present, the portable C path elsewhere), and building takes about a second.
OpenMP regions run in the OpenMP runtime torch already loaded (same soname), so these kernels
share torch's threads and its ``torch.set_num_threads``. The registry lists the native kernels
only where a compiler is found (`compiler()`); a build that fails raises `NativeBuildError` with
the compiler's message, and ``LIGHTSPEED_KERNEL_DISABLE_NATIVE=1`` takes them out. An unwritable
cache folder falls back to one under the system temp folder.
"""

from __future__ import annotations

import contextvars
import ctypes
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..env import kernel_env

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("quant_gemm.c", "q8_gemm.c", "attention.c", "elementwise.c")
HEADERS = ("simd.h",)
FLAGS = ("-O3", "-march=native", "-std=gnu11", "-fPIC", "-shared", "-fno-math-errno")
OPENMP = ("-fopenmp",)

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# name -> argument types (every function returns int: 0 = done, else an error code)
SIGNATURES = {
    "ls_w4_linear": (_P, _I, _I, _P, _P, _P, _I, _I, _P, _P, _I),
    "ls_w8_linear": (_P, _I, _I, _P, _P, _P, _I, _I, _P, _P, _I),
    "ls_w4_linear_q8": (_P, _I, _I, _P, _P, _P, _P, _I, _I, _P, _P, _I),
    "ls_w8_linear_q8": (_P, _I, _I, _P, _P, _P, _P, _I, _I, _P, _P, _I),
    "ls_q8_weight_scales": (_P, _I, _I, _I, _I, _P, _P),
    "ls_q8_simd": (),
    "ls_w4_dequant": (_P, _P, _P, _I, _I, _P, _I, _P),
    "ls_w8_dequant": (_P, _P, _P, _I, _I, _P, _I, _P),
    "ls_paged_attention_decode": (_P, _I, _I, _P, _P, ctypes.c_int, _I, _I, _I, _P, _I, _P, _P, _I, _I, _F, _F, _F, _F,
                                  _P),
    "ls_rms_norm": (_P, _I, _I, _I, _P, _F, _P, _I),
    "ls_fused_add_rms_norm": (_P, _P, _I, _I, _P, _F, _P),
    "ls_silu_and_mul": (_P, _I, _I, _I, _P, _I),
    "ls_rope": (_P, _I, _P, _I, _I, _P, _I, _I, _I, _P, _I, _I, ctypes.c_int),
    "ls_store_kv": (_P, _I, _P, _I, _I, _I, _P, _P, _P, _I),
}


# While a graph records (graph.py), every native call is appended here (per thread / task).
RECORDING: contextvars.ContextVar[list | None] = contextvars.ContextVar("lightspeed_native_recording", default=None)


class NativeBuildError(RuntimeError):
    """The C kernels could not be compiled or loaded on this machine."""


def compiler() -> str | None:
    """The C compiler to use: LIGHTSPEED_KERNEL_CC / CC, else cc, gcc or clang on PATH (None: none)."""
    env = kernel_env()
    if env.native_cc:
        return shutil.which(env.native_cc)
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def available() -> bool:
    """Whether the native kernels should be registered on this machine."""
    return not kernel_env().disable_native and compiler() is not None


def _cpu_signature() -> str:
    # A cache shared between machines (a network home) must not hand one CPU's -march=native build
    # to another: key it on the CPU's feature flags.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _library_path(cc: str) -> Path:
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update((CSRC / name).read_bytes())
    for part in (cc, " ".join(FLAGS), _cpu_signature(), platform.machine()):
        digest.update(part.encode())
    return Path(kernel_env().native_cache_dir) / f"lightspeed_cpu_{digest.hexdigest()[:16]}.so"


def _compile(cc: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    sources = [str(CSRC / name) for name in SOURCES]
    errors = []
    for extra in (OPENMP, ()):  # Apple's clang has no OpenMP: then the kernels run single-threaded
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        proc = subprocess.run([cc, *FLAGS, *extra, "-o", tmp, *sources], capture_output=True, text=True)
        if proc.returncode == 0:
            os.replace(tmp, target)  # atomic: a concurrent loader never sees half a library
            return
        os.unlink(tmp)
        errors.append(proc.stderr.strip()[-2000:])
    raise NativeBuildError(f"building the native CPU kernels with {cc} failed "
                           f"(LIGHTSPEED_KERNEL_DISABLE_NATIVE=1 turns them off):\n" + "\n".join(errors))


def _build(cc: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:  # one build even with many processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _compile(cc, target)


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded kernels (built first if this machine has no build of these sources yet)."""
    import torch  # noqa: F401  (its OpenMP runtime must be loaded first, for ours to resolve to it)

    cc = compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found for the native CPU kernels (set LIGHTSPEED_KERNEL_CC)")
    target = _library_path(cc)
    if not target.exists():
        try:
            _build(cc, target)
        except PermissionError:  # a read-only cache folder: build under the temp folder instead
            target = Path(tempfile.gettempdir()) / f"lightspeed-kernels-{os.getuid()}" / target.name
            if not target.exists():
                _build(cc, target)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        raise NativeBuildError(f"cannot load the native CPU kernels {target}: {e}") from None
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return lib


def call(name: str, *args) -> int:
    """Run native kernel `name` (a key of SIGNATURES) and return its status; while a graph is
    being recorded the call (function and arguments) is appended to it as well."""
    fn = getattr(library(), name)
    status = fn(*args)
    calls = RECORDING.get()
    if calls is not None:
        calls.append((fn, args))
    return status
