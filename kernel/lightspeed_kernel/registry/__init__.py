"""The kernel registry: register implementations, select the best one per platform and dtype."""

from .overrides import override
from .platform import CPU, Platform, current_platform, platform_of
from .plugins import ENTRY_POINT_GROUP, PluginStatus
from .priority import Priority
from .select import (
    REGISTRY,
    Candidate,
    Explanation,
    KernelRegistry,
    KernelSelectionError,
    explain,
    list_kernels,
    refresh,
    register_kernel,
    select_kernel,
)
from .spec import ANY, Capability, KernelSpec, SelectedKernel, as_dtype

__all__ = [
    "ANY",
    "CPU",
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "Candidate",
    "Capability",
    "Explanation",
    "KernelRegistry",
    "KernelSelectionError",
    "KernelSpec",
    "Platform",
    "PluginStatus",
    "Priority",
    "SelectedKernel",
    "as_dtype",
    "current_platform",
    "explain",
    "list_kernels",
    "override",
    "platform_of",
    "refresh",
    "register_kernel",
    "select_kernel",
]
