"""KernelSpec: what one registered implementation is, and where it can run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from .platform import Platform
from .priority import PRIORITY_MAX

_DEVICE_ALIASES = {
    "any": (None, None),
    "cpu": (("cpu",), None),
    "cuda": (("cuda",), None),  # any GPU torch calls cuda: NVIDIA or ROCm
    "gpu": (("cuda",), None),
    "nvidia": (("cuda",), ("nvidia",)),
    "rocm": (("cuda",), ("amd",)),
    "amd": (("cuda",), ("amd",)),
}


@dataclass(frozen=True)
class Capability:
    """Where a kernel can run. ``None`` fields match anything."""

    device_types: tuple[str, ...] | None = None
    """torch device types, e.g. ("cuda",); ROCm GPUs are "cuda" too."""
    vendors: tuple[str, ...] | None = None
    """"nvidia", "amd", "cpu"."""
    min_compute_capability: tuple[int, int] | None = None
    max_compute_capability: tuple[int, int] | None = None
    """Inclusive bounds, e.g. (9, 0)..(9, 0) for a Hopper-only kernel."""

    def reject_reason(self, platform: Platform) -> str | None:
        """Why this capability excludes ``platform`` (None when it runs there)."""
        if self.device_types is not None and platform.device_type not in self.device_types:
            return f"needs device {'/'.join(self.device_types)}, platform is {platform.device_type}"
        if self.vendors is not None and platform.vendor not in self.vendors:
            return f"needs vendor {'/'.join(self.vendors)}, platform is {platform.vendor}"
        cc = platform.compute_capability
        if self.min_compute_capability is not None and (cc is None or cc < self.min_compute_capability):
            return f"needs compute capability >= {_cc(self.min_compute_capability)}, platform has {_cc(cc)}"
        if self.max_compute_capability is not None and (cc is None or cc > self.max_compute_capability):
            return f"needs compute capability <= {_cc(self.max_compute_capability)}, platform has {_cc(cc)}"
        return None

    @classmethod
    def coerce(cls, value: Capability | str | Mapping[str, Any] | Iterable[str] | None) -> Capability:
        """Accept a Capability, ``"any"``/``"cpu"``/``"cuda"``/``"nvidia"``/``"rocm"``, a mapping of
        the field names (``min_compute_capability=(9, 0)``), or an iterable of device types."""
        if value is None:
            return ANY
        if isinstance(value, Capability):
            return value
        if isinstance(value, str):
            if value.lower() not in _DEVICE_ALIASES:
                raise ValueError(f"unknown capability {value!r}; use one of {sorted(_DEVICE_ALIASES)}")
            device_types, vendors = _DEVICE_ALIASES[value.lower()]
            return cls(device_types, vendors)
        if isinstance(value, Mapping):
            fields = dict(value)
            for key in ("device_types", "vendors"):
                if isinstance(fields.get(key), str):
                    fields[key] = (fields[key],)
                if fields.get(key) is not None:
                    fields[key] = tuple(fields[key])
            for key in ("min_compute_capability", "max_compute_capability"):
                if fields.get(key) is not None:
                    fields[key] = tuple(fields[key])
            return cls(**fields)
        return cls(device_types=tuple(value))

    def __str__(self) -> str:
        parts = ["/".join(self.device_types) if self.device_types else "any device"]
        if self.vendors:
            parts.append("/".join(self.vendors))
        if self.min_compute_capability or self.max_compute_capability:
            lo = _cc(self.min_compute_capability) if self.min_compute_capability else ""
            hi = _cc(self.max_compute_capability) if self.max_compute_capability else ""
            parts.append(f"cc {lo}..{hi}")
        return " ".join(parts)


def _cc(cc: tuple[int, int] | None) -> str:
    return "none" if cc is None else f"{cc[0]}.{cc[1]}"


ANY = Capability()


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.bfloat16`` or ``"bfloat16"`` / ``"bf16"`` -> ``torch.bfloat16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = {
        "bf16": "bfloat16",
        "fp16": "float16",
        "half": "float16",
        "fp32": "float32",
        "float": "float32",
    }.get(dtype, dtype)
    name = name.removeprefix("torch.")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


@dataclass(frozen=True)
class KernelSpec:
    """One registered implementation of a family/mode (e.g. ``attention/decode``)."""

    name: str
    """Unique within family/mode; what overrides name."""
    family: str
    mode: str
    solution: str
    """Where it comes from: reference, triton, flashinfer, deepgemm, a plugin's name, ..."""
    priority: int
    """Band + offset (see :class:`Priority`)."""
    capability: Capability = ANY
    dtypes: frozenset[torch.dtype] | None = None
    """Activation dtypes it accepts; None = any."""
    features: frozenset[str] = frozenset()
    """Optional abilities (e.g. "fp8_kv", "soft_cap"); a request for features needs all of them."""
    traits: Mapping[str, Any] = field(default_factory=dict)
    """Shape/layout limits (e.g. page_size=64, head_dim=(64, 128)); a requested trait must equal
    the value, or be in it when the value is a tuple/list/set. An undeclared trait matches any value."""
    tags: frozenset[str] = frozenset()
    """Free-form labels; an ``objective`` of select_kernel ranks kernels tagged with it first."""
    impl: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.priority <= PRIORITY_MAX:
            raise ValueError(f"kernel {self.name!r}: priority {self.priority} outside 0..{PRIORITY_MAX}")
        if not self.name or "/" in self.name:
            raise ValueError(f"kernel name {self.name!r} must be non-empty and contain no '/'")

    @property
    def key(self) -> str:
        return f"{self.family}/{self.mode}"

    def reject_reason(
        self,
        dtype: torch.dtype | None,
        platform: Platform,
        features: frozenset[str],
        traits: Mapping[str, Any],
    ) -> str | None:
        """Why this kernel cannot serve the request (None when it can)."""
        reason = self.capability.reject_reason(platform)
        if reason:
            return reason
        if dtype is not None and self.dtypes is not None and dtype not in self.dtypes:
            have = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return f"dtype {str(dtype).removeprefix('torch.')} not in ({have})"
        missing = features - self.features
        if missing:
            return f"lacks features {sorted(missing)}"
        for trait, wanted in traits.items():
            if trait not in self.traits:
                continue  # a kernel that does not declare a trait handles any value of it
            have = self.traits[trait]
            ok = wanted in have if isinstance(have, (tuple, list, set, frozenset)) else wanted == have
            if not ok:
                return f"trait {trait}={wanted!r} not supported (has {have!r})"
        return None


class SelectedKernel(NamedTuple):
    """The result of :func:`select_kernel`: call ``impl`` with the op's arguments."""

    name: str
    impl: Callable[..., Any]
    spec: KernelSpec
