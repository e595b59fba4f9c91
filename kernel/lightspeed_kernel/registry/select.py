"""The registry proper: registration, selection (cached), explanation.

Selection = filter the family/mode's kernels by platform capability, dtype, features and traits,
then rank: kernels tagged with the requested objective first, then by priority (high first),
then by name, so ties are broken the same way on every run. An override replaces the ranking
but never the filter: forcing a kernel that cannot run is an error that lists what can.

Ops call :meth:`KernelRegistry.impl_for` per call: one tuple build and one dict lookup; every
change to what selection could return (registration, plugins, env refresh) clears the caches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..env import kernel_env
from .overrides import clear_config_cache, context_overrides, resolve_override
from .platform import Platform, current_platform, platform_of
from .plugins import PluginStatus, load_entry_point_plugins
from .priority import Priority
from .spec import Capability, KernelSpec, SelectedKernel, as_dtype


class KernelSelectionError(LookupError):
    """No kernel can serve a request, or an override names one that cannot."""


@dataclass(frozen=True)
class Candidate:
    """One kernel as :func:`explain` sees it."""

    name: str
    solution: str
    priority: int
    rank: int | None
    """1 = would be selected without override; None when rejected."""
    reason: str | None
    """Why it was rejected (None when it can run)."""


@dataclass(frozen=True)
class Explanation:
    """Every candidate of one selection, ranked or rejected, and the final choice."""

    family: str
    mode: str
    dtype: torch.dtype | None
    platform: Platform
    candidates: tuple[Candidate, ...]
    selected: str | None
    override: tuple[str, str] | None
    """(kernel name, source) when an override is in force."""
    error: str | None = None

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.") if self.dtype is not None else "any"
        lines = [f"{self.family}/{self.mode}  dtype={dtype}  platform={self.platform}"]
        if self.override:
            lines.append(f"override: {self.override[0]} (from {self.override[1]})")
        for c in self.candidates:
            mark = "*" if c.name == self.selected else " "
            rank = f"#{c.rank}" if c.rank is not None else "--"
            status = "ok" if c.reason is None else f"rejected: {c.reason}"
            lines.append(f" {mark} {rank:>3}  {c.name:<32} {c.solution:<12} prio {c.priority:>2}  {status}")
        if not self.candidates:
            lines.append("   (no kernels registered)")
        lines.append(f"selected: {self.selected}" if self.selected else f"error: {self.error}")
        return "\n".join(lines)


class KernelRegistry:
    """Kernels by family/mode, with cached selection."""

    def __init__(self, load_plugins: Callable[[], list[PluginStatus]] | None = load_entry_point_plugins):
        self._specs: dict[str, dict[str, KernelSpec]] = {}
        self._select_cache: dict[tuple, SelectedKernel] = {}
        self._impl_cache: dict[tuple, Callable[..., Any]] = {}
        self._lock = threading.RLock()
        self._load_plugins = load_plugins
        self._plugins: list[PluginStatus] | None = None

    # registration -------------------------------------------------------------------------
    def add(self, spec: KernelSpec) -> KernelSpec:
        if spec.impl is None:
            raise ValueError(f"kernel {spec.name!r} has no implementation")
        with self._lock:
            table = self._specs.setdefault(spec.key, {})
            if spec.name in table:
                raise ValueError(f"kernel {spec.name!r} is already registered for {spec.key}")
            table[spec.name] = spec
            self.clear_cache()
        return spec

    def remove(self, family: str, mode: str, name: str) -> None:
        with self._lock:
            del self._specs[f"{family}/{mode}"][name]
            self.clear_cache()

    def clear_cache(self) -> None:
        with self._lock:
            self._select_cache.clear()
            self._impl_cache.clear()

    def ensure_plugins(self) -> list[PluginStatus]:
        """Load entry-point plugins once (a no-op afterwards)."""
        if self._plugins is None:
            with self._lock:
                if self._plugins is None:
                    self._plugins = []  # set first: a plugin's own selections must not recurse
                    if self._load_plugins is not None and not kernel_env().disable_plugins:
                        self._plugins = self._load_plugins()
                    self.clear_cache()
        return self._plugins

    def specs(self, family: str | None = None, mode: str | None = None) -> list[KernelSpec]:
        """Registered kernels (optionally of one family / mode), sorted by key, priority, name."""
        self.ensure_plugins()
        with self._lock:
            found = [
                spec
                for key, table in self._specs.items()
                for spec in table.values()
                if (family is None or spec.family == family) and (mode is None or spec.mode == mode)
            ]
        return sorted(found, key=lambda s: (s.family, s.mode, -s.priority, s.name))

    # selection ----------------------------------------------------------------------------
    def _rank(self, family, mode, dtype, features, platform, traits, objective):
        """(ranked runnable specs, {name: reject reason}, all specs)."""
        table = self._specs.get(f"{family}/{mode}", {})
        runnable, rejected = [], {}
        for spec in table.values():
            reason = spec.reject_reason(dtype, platform, features, traits)
            if reason is None:
                runnable.append(spec)
            else:
                rejected[spec.name] = reason
        runnable.sort(
            key=lambda s: (objective not in s.tags if objective != "default" else False, -s.priority, s.name)
        )
        return runnable, rejected, table

    def _choose(self, family, mode, dtype, features, platform, traits, objective, override, context):
        runnable, rejected, table = self._rank(family, mode, dtype, features, platform, traits, objective)
        forced = resolve_override(family, mode, override, context)
        can_run = ", ".join(s.name for s in runnable) or "none"
        what = f"{family}/{mode} (dtype {_dtype_name(dtype)}, platform {platform})"
        if forced is not None:
            name, source = forced
            if name not in table:
                raise KernelSelectionError(
                    f"override {name!r} (from {source}) names no kernel of {family}/{mode}; "
                    f"registered: {', '.join(sorted(table)) or 'none'}; can run: {can_run}"
                )
            if name in rejected:
                raise KernelSelectionError(
                    f"override {name!r} (from {source}) cannot run for {what}: {rejected[name]}; can run: {can_run}"
                )
            return table[name], forced
        if not runnable:
            if not table:
                raise KernelSelectionError(f"no kernel is registered for {family}/{mode}")
            reasons = "; ".join(f"{n}: {r}" for n, r in sorted(rejected.items()))
            raise KernelSelectionError(f"no kernel can run {what}: {reasons}")
        return runnable[0], None

    def select(
        self,
        family: str,
        mode: str,
        dtype: torch.dtype | str | None,
        *,
        features: Iterable[str] | None = None,
        platform: Platform | None = None,
        traits: Mapping[str, Any] | None = None,
        objective: str = "default",
        override: str | None = None,
    ) -> SelectedKernel:
        dtype = as_dtype(dtype) if dtype is not None else None
        features = frozenset(features or ())
        platform = platform if platform is not None else current_platform()
        trait_items = tuple(sorted((traits or {}).items()))
        context = context_overrides()
        key = (family, mode, dtype, features, platform, trait_items, objective, override, context)
        selected = self._select_cache.get(key)
        if selected is None:
            self.ensure_plugins()
            with self._lock:
                spec, _ = self._choose(
                    family, mode, dtype, features, platform, dict(trait_items), objective, override, context
                )
                selected = SelectedKernel(spec.name, spec.impl, spec)
                self._select_cache[key] = selected
        return selected

    def impl_for(self, family: str, mode: str, tensor: torch.Tensor, features: tuple[str, ...] = ()):
        """The implementation for an op call on ``tensor`` (hot path: one dict lookup when cached)."""
        key = (family, mode, tensor.dtype, tensor.device, features, context_overrides())
        impl = self._impl_cache.get(key)
        if impl is None:
            impl = self.select(
                family, mode, tensor.dtype, features=features, platform=platform_of(tensor.device)
            ).impl
            self._impl_cache[key] = impl
        return impl

    def explain(
        self,
        family: str,
        mode: str,
        dtype: torch.dtype | str | None = None,
        *,
        features: Iterable[str] | None = None,
        platform: Platform | None = None,
        traits: Mapping[str, Any] | None = None,
        objective: str = "default",
        override: str | None = None,
    ) -> Explanation:
        self.ensure_plugins()
        dtype = as_dtype(dtype) if dtype is not None else None
        features = frozenset(features or ())
        platform = platform if platform is not None else current_platform()
        traits = dict(traits or {})
        context = context_overrides()
        with self._lock:
            runnable, rejected, table = self._rank(family, mode, dtype, features, platform, traits, objective)
            ranks = {spec.name: i + 1 for i, spec in enumerate(runnable)}
            order = [s.name for s in runnable] + sorted(rejected, key=lambda n: (-table[n].priority, n))
            candidates = tuple(
                Candidate(n, table[n].solution, table[n].priority, ranks.get(n), rejected.get(n))
                for n in order
            )
            selected, forced, error = None, resolve_override(family, mode, override, context), None
            try:
                spec, _ = self._choose(
                    family, mode, dtype, features, platform, traits, objective, override, context
                )
                selected = spec.name
            except KernelSelectionError as e:
                error = str(e)
        return Explanation(family, mode, dtype, platform, candidates, selected, forced, error)

    def plugins(self) -> list[PluginStatus]:
        return list(self.ensure_plugins())


def _dtype_name(dtype: torch.dtype | None) -> str:
    return "any" if dtype is None else str(dtype).removeprefix("torch.")


REGISTRY = KernelRegistry()


def register_kernel(
    family: str,
    mode: str,
    *,
    name: str,
    solution: str,
    priority: int = Priority.REFERENCE,
    capability: Capability | str | Mapping[str, Any] | Iterable[str] | None = None,
    dtypes: Iterable[torch.dtype | str] | None = None,
    features: Iterable[str] = (),
    traits: Mapping[str, Any] | None = None,
    tags: Iterable[str] = (),
    registry: KernelRegistry | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering ``fn`` as kernel ``name`` of ``family/mode``; returns ``fn`` unchanged.

    ``capability``: a :class:`Capability`, ``"any"``/``"cpu"``/``"cuda"``/``"nvidia"``/``"rocm"``,
    or a mapping of Capability fields; None = any device. ``dtypes``: None = any dtype.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        spec = KernelSpec(
            name=name,
            family=family,
            mode=mode,
            solution=solution,
            priority=int(priority),
            capability=Capability.coerce(capability),
            dtypes=frozenset(as_dtype(d) for d in dtypes) if dtypes is not None else None,
            features=frozenset(features),
            traits=dict(traits or {}),
            tags=frozenset(tags),
            impl=fn,
        )
        (registry or REGISTRY).add(spec)
        return fn

    return decorate


def select_kernel(
    family: str,
    mode: str,
    dtype: torch.dtype | str | None,
    *,
    features: Iterable[str] | None = None,
    platform: Platform | None = None,
    traits: Mapping[str, Any] | None = None,
    objective: str = "default",
    override: str | None = None,
) -> SelectedKernel:
    """The best kernel for family/mode on ``platform`` (default: :func:`current_platform`).

    Cached per (arguments, enclosing override blocks). Raises KernelSelectionError when nothing
    can run, or when an override names an unknown kernel or one that cannot run here.
    """
    return REGISTRY.select(
        family,
        mode,
        dtype,
        features=features,
        platform=platform,
        traits=traits,
        objective=objective,
        override=override,
    )


def explain(
    family: str,
    mode: str,
    dtype: torch.dtype | str | None = None,
    *,
    features: Iterable[str] | None = None,
    platform: Platform | None = None,
    traits: Mapping[str, Any] | None = None,
    objective: str = "default",
    override: str | None = None,
) -> Explanation:
    """Every candidate of family/mode with its rank or the reason it was rejected (``print`` it)."""
    return REGISTRY.explain(
        family,
        mode,
        dtype,
        features=features,
        platform=platform,
        traits=traits,
        objective=objective,
        override=override,
    )


def list_kernels(family: str | None = None, mode: str | None = None) -> list[KernelSpec]:
    """Every registered kernel (plugins included), sorted by family, mode, priority, name."""
    return REGISTRY.specs(family, mode)


def refresh() -> None:
    """Re-read the environment and config file and drop cached selections (after changing env)."""
    kernel_env.cache_clear()
    clear_config_cache()
    REGISTRY.clear_cache()
