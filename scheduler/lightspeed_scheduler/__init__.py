"""Lightspeed's scheduler: the C++ control plane that plans every step.

Public API: ``Scheduler``, ``SchedulerConfig``, ``RequestSpec``, ``Plan``, ``DraftProposer``. See ``_core.pyi`` for the
typed signatures and scheduler/README.md for the protocol.
"""

from ._core import DraftProposer, Plan, RequestSpec, Scheduler, SchedulerConfig

__all__ = ["DraftProposer", "Plan", "RequestSpec", "Scheduler", "SchedulerConfig"]
__version__ = "0.3.1"
