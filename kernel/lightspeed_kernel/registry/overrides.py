"""Kernel overrides: force a named kernel for a family/mode.

Precedence, highest first: the ``override=`` argument of select_kernel > the innermost
``with override(...)`` block > env ``LIGHTSPEED_KERNEL_OVERRIDE_<FAMILY>_<MODE>`` > the
``[overrides]`` table of the TOML file named by ``LIGHTSPEED_KERNEL_CONFIG``.

The context manager keeps its mapping in a ContextVar (per thread / asyncio task), as an
immutable tuple that selection caches can use as part of their key.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

from ..env import kernel_env, override_env_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

OverrideItems = tuple[tuple[str, str], ...]

_context: ContextVar[OverrideItems] = ContextVar("lightspeed_kernel_overrides", default=())


def _check_key(key: str) -> str:
    family, sep, mode = key.partition("/")
    if not sep or not family or not mode or "/" in mode:
        raise ValueError(f"override key {key!r} must look like 'family/mode', e.g. 'attention/decode'")
    return key


@contextlib.contextmanager
def override(mapping: Mapping[str, str] | None = None, /, **kernels: str) -> Iterator[None]:
    """Force kernels inside a ``with`` block: ``with override(**{"attention/decode": "name"}):``.

    Nested blocks merge, the inner one winning for the keys it names.
    """
    wanted = dict(mapping or {})
    wanted.update(kernels)
    merged = dict(_context.get())
    for key, name in wanted.items():
        merged[_check_key(key)] = str(name)
    token = _context.set(tuple(sorted(merged.items())))
    try:
        yield
    finally:
        _context.reset(token)


def context_overrides() -> OverrideItems:
    """The overrides of the enclosing ``with override(...)`` blocks (hashable)."""
    return _context.get()


@functools.lru_cache(maxsize=8)
def _config_file_overrides(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"LIGHTSPEED_KERNEL_CONFIG={path}: cannot read: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"LIGHTSPEED_KERNEL_CONFIG={path}: invalid TOML: {e}") from e
    table = data.get("overrides", {})
    if not isinstance(table, dict):
        raise ValueError(f"LIGHTSPEED_KERNEL_CONFIG={path}: [overrides] must be a table")
    result: dict[str, str] = {}
    for key, value in table.items():
        if isinstance(value, dict):  # [overrides.attention] decode = "name"
            for mode, name in value.items():
                result[f"{key}/{mode}"] = str(name)
        else:  # [overrides] "attention/decode" = "name"
            result[_check_key(key)] = str(value)
    return result


def config_overrides() -> dict[str, str]:
    """The ``[overrides]`` of the LIGHTSPEED_KERNEL_CONFIG file ({} when unset)."""
    path = kernel_env().config_path
    return _config_file_overrides(path) if path else {}


def clear_config_cache() -> None:
    _config_file_overrides.cache_clear()


def resolve_override(
    family: str, mode: str, argument: str | None, context: OverrideItems
) -> tuple[str, str] | None:
    """``(kernel name, source)`` of the override in force for family/mode, or None."""
    if argument:
        return argument, "argument"
    key = f"{family}/{mode}"
    for ctx_key, name in context:
        if ctx_key == key:
            return name, "context"
    env_name = override_env_name(family, mode)
    env_value = kernel_env().overrides.get(env_name)
    if env_value:
        return env_value, f"env {env_name}"
    name = config_overrides().get(key)
    if name:
        return name, f"config {kernel_env().config_path}"
    return None
