"""How a public op finds its implementation: the registry's per-call cache, keyed on the
dispatch tensor's dtype and device (its platform), the requested features and the enclosing
override blocks. One dict lookup on the hot path."""

from __future__ import annotations

import torch

from ..registry.select import REGISTRY

impl_for = REGISTRY.impl_for

FP8_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz})

# Features an op requests (kernels must declare them in register_kernel(features=...)).
FP8_KV = "fp8_kv"
SOFT_CAP = "soft_cap"
