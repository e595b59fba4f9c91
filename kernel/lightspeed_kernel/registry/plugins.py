"""Entry-point plugins: packages that add kernels to the registry.

A plugin declares, in its pyproject::

    [project.entry-points."lightspeed_kernel.plugins"]
    my_kernels = "my_package.kernels:register"

The target is loaded once, lazily (on the first selection, explain or listing). A callable target
is called with no arguments; a module target registers its kernels when imported. A failing
plugin is reported with a warning and skipped: a broken plugin must not take the engine down.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib import metadata

ENTRY_POINT_GROUP = "lightspeed_kernel.plugins"


@dataclass(frozen=True)
class PluginStatus:
    """One entry point and how loading it went."""

    name: str
    value: str
    error: str | None = None


def load_entry_point_plugins() -> list[PluginStatus]:
    """Load every plugin of the ``lightspeed_kernel.plugins`` group; report each."""
    statuses = []
    for entry_point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        try:
            target = entry_point.load()
            if callable(target):
                target()
        except Exception as e:  # noqa: BLE001 - any plugin failure is isolated
            message = f"{type(e).__name__}: {e}"
            warnings.warn(
                f"lightspeed_kernel plugin {entry_point.name!r} failed to load: {message}", stacklevel=2
            )
            statuses.append(PluginStatus(entry_point.name, entry_point.value, message))
        else:
            statuses.append(PluginStatus(entry_point.name, entry_point.value))
    return statuses
