"""Pure-torch reference kernels: the ground truth of every op family, runnable on any device.

Importing a module registers its kernels (name ``reference``, band REFERENCE, any device/dtype).
"""

from . import activation, attention, gemm, kv_store, memory, moe, norm, quantize, rope, sampling, spec

__all__ = ["activation", "attention", "gemm", "kv_store", "memory", "moe", "norm", "quantize", "rope", "sampling", "spec"]
