"""argparse flags generated from config dataclasses: one flag per field, help from metadata.

Values stay strings until `config_from_args` converts them by the field's annotation, so a config
that accepts "2GiB" for an int field keeps working, and a bad value is one clear error.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_bool(field: dataclasses.Field) -> bool:
    return str(field.type).replace(" ", "") in ("bool", "<class'bool'>")


def add_config_flags(parser: argparse.ArgumentParser, cls: type, title: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Add a group of flags, one per field of dataclass `cls`; returns the field names added."""
    group = parser.add_argument_group(title, (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else None)
    added = []
    for field in dataclasses.fields(cls):
        if field.name in skip or not field.init:
            continue
        help_text = field.metadata.get("help", "")
        default = field.default if field.default is not dataclasses.MISSING else None
        kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS}
        kwargs["help"] = help_text if default is None else f"{help_text} (default: {default})"
        if _is_bool(field):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["metavar"] = field.name.upper()
            if field.metadata.get("choices"):
                kwargs["choices"] = [str(c) for c in field.metadata["choices"]]
        group.add_argument(flag_of(field.name), **kwargs)
        added.append(field.name)
    return added


def _convert(text: str, annotation: str) -> Any:
    kinds = [k.strip() for k in str(annotation).split("|")]
    if "None" in kinds and text.lower() in ("none", "null"):
        return None
    for kind in kinds:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    return text


def config_from_args(cls: type, values: dict[str, Any], **overrides: Any):
    """Build `cls` from parsed flag values (strings, or bools from BooleanOptionalAction)."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        if name not in by_name:
            continue
        if isinstance(value, str):
            try:
                value = _convert(value, by_name[name].type)
            except ValueError:
                raise ValueError(f"{flag_of(name)}: cannot read {value!r} as {by_name[name].type}") from None
        kwargs[name] = value
    kwargs.update(overrides)
    return cls(**kwargs)


def engine_config_from_args(engine_cls: type, values: dict[str, Any], model: str | None):
    """EngineConfig through its own string-aware constructor when it has one."""
    names = {f.name for f in dataclasses.fields(engine_cls)}
    picked = {k: v for k, v in values.items() if k in names and k != "model"}
    if not hasattr(engine_cls, "from_cli"):
        return config_from_args(engine_cls, picked, model=model)
    try:
        return engine_cls.from_cli(model=model, **picked)
    except ValueError as error:
        for name, value in picked.items():  # name the flag whose value is unreadable
            try:
                engine_cls.from_cli(**{name: value})
            except ValueError as e:
                raise ValueError(f"{flag_of(name)} {value}: {e}") from None
        raise error
