"""What the kernels need to know about the device a tensor lives on (read once per device)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch


@dataclass(frozen=True)
class DeviceInfo:
    """arch_major None means "no GPU: Triton's CPU interpreter"."""

    arch_major: int | None
    num_sms: int


@cache
def _cuda_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(props.major, props.multi_processor_count)


def device_info(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        return _cuda_info(device.index if device.index is not None else torch.cuda.current_device())
    return DeviceInfo(None, 4)
