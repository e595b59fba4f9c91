"""Registration shorthand shared by the reference modules."""

from __future__ import annotations

from ..registry import Priority, register_kernel


def reference(family: str, mode: str, features: tuple[str, ...] = ()):
    """Register a torch reference: runs on any device and dtype, lowest priority."""
    return register_kernel(
        family,
        mode,
        name="reference",
        solution="reference",
        priority=Priority.REFERENCE,
        capability="any",
        features=features,
    )
