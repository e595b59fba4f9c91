"""What hardware a kernel would run on, detected lazily (importing this never initialises CUDA)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Platform:
    """A device as kernels see it.

    ``device_type`` is torch's device type (``cpu``, ``cuda`` — ROCm devices are ``cuda`` too);
    ``vendor`` tells them apart (``cpu``, ``nvidia``, ``amd``, or ``unknown``).
    """

    device_type: str
    vendor: str
    name: str = ""
    compute_capability: tuple[int, int] | None = None
    """(major, minor): 9.0 is Hopper; on ROCm the gfx major/minor."""
    sm_count: int = 0
    """Streaming multiprocessors (compute units on ROCm); 0 when unknown or CPU."""

    @property
    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda" and self.vendor == "nvidia"

    @property
    def is_rocm(self) -> bool:
        return self.device_type == "cuda" and self.vendor == "amd"

    def __str__(self) -> str:
        if self.is_cpu:
            return "cpu"
        cc = (
            f" sm_{self.compute_capability[0]}{self.compute_capability[1]}" if self.compute_capability else ""
        )
        sms = f" ({self.sm_count} SMs)" if self.sm_count else ""
        return f"{self.vendor} {self.name or self.device_type}{cc}{sms}".strip()

    @classmethod
    def parse(cls, text: str) -> Platform:
        """A platform from a short description, for the CLI and tests.

        ``cpu``; ``cuda`` (sm_90 assumed); ``sm_90`` / ``sm90`` / ``cuda:9.0``; ``rocm`` / ``rocm:9.4``.
        """
        text = text.strip().lower()
        if text == "cpu":
            return CPU
        match = re.fullmatch(r"(cuda|sm_?|rocm|amd)?:?(\d+)?(?:\.(\d+))?", text)
        if not match or not (match.group(1) or match.group(2)):
            raise ValueError(f"unknown platform {text!r}: use cpu, cuda, sm_90, cuda:9.0 or rocm:9.4")
        kind, major, minor = match.groups()
        vendor = "amd" if kind in ("rocm", "amd") else "nvidia"
        if major is None:
            cc = (9, 4) if vendor == "amd" else (9, 0)
        elif minor is None and len(major) >= 2:
            cc = (int(major[:-1]), int(major[-1]))  # sm_90 -> (9, 0), sm_100 -> (10, 0)
        else:
            cc = (int(major), int(minor or 0))
        return cls("cuda", vendor, compute_capability=cc)


CPU = Platform("cpu", "cpu", name="cpu")

_by_device: dict[tuple[str, int], Platform] = {}


def _detect_cuda(index: int) -> Platform:
    props = torch.cuda.get_device_properties(index)
    vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
    return Platform(
        "cuda",
        vendor,
        name=props.name,
        compute_capability=(props.major, props.minor),
        sm_count=props.multi_processor_count,
    )


def platform_of(device: torch.device | str) -> Platform:
    """The platform of a device (cached per device); CUDA is queried on the first call only."""
    device = torch.device(device)
    if device.type == "cpu":
        return CPU
    index = device.index
    if index is None:
        index = torch.cuda.current_device() if device.type == "cuda" else 0
    key = (device.type, index)
    platform = _by_device.get(key)
    if platform is None:
        platform = (
            _detect_cuda(index) if device.type == "cuda" else Platform(device.type, "unknown", device.type)
        )
        _by_device[key] = platform
    return platform


def current_platform() -> Platform:
    """The default accelerator's platform (the current CUDA/ROCm device if any), else the CPU."""
    if torch.cuda.is_available():  # NVML-based: does not initialise a CUDA context
        return platform_of("cuda")
    return CPU
