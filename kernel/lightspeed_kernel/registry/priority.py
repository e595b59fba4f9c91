"""Priority bands: a kernel's rank among the candidates of one family/mode.

A band says where an implementation comes from; the offset (0..3) orders kernels inside a band.
PLUGIN sits above every built-in band, so an installed plugin wins without auditing built-ins.
"""

from __future__ import annotations

from enum import IntEnum


class Priority(IntEnum):
    """Priority bands; ``Priority.PERFORMANT + 2`` (an int) is a valid priority."""

    REFERENCE = 0  # pure torch, the ground truth, runs everywhere
    PORTABLE = 4  # portable fast kernels (e.g. Triton)
    PERFORMANT = 8  # tuned kernels (e.g. library kernels for one vendor)
    SPECIALIZED = 12  # kernels for one architecture or shape regime
    PLUGIN = 16  # kernels from installed plugins

    @classmethod
    def of(cls, band: Priority, offset: int = 0) -> int:
        """``band + offset`` with ``offset`` checked to stay inside the band (0..3)."""
        if not 0 <= offset <= 3:
            raise ValueError(f"priority offset must be in 0..3, got {offset}")
        return int(band) + offset


PRIORITY_MAX = int(Priority.PLUGIN) + 3


def band_of(priority: int) -> Priority:
    """The band a numeric priority falls in."""
    if not 0 <= priority <= PRIORITY_MAX:
        raise ValueError(f"priority must be in 0..{PRIORITY_MAX}, got {priority}")
    return Priority(priority - priority % 4)
