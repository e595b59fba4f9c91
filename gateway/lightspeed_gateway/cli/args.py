"""argparse flags generated from config dataclasses: one flag per field, help from metadata.

Values stay strings until `config_from_args` converts them by the field's annotation, so a config
that accepts "2GiB" for an int field keeps working, and a bad value is one clear error.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from typing import Any


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_bool(field: dataclasses.Field) -> bool:
    return str(field.type).replace(" ", "") in ("bool", "<class'bool'>")


def _is_tuple(field: dataclasses.Field) -> bool:
    return str(field.type).replace(" ", "").startswith("tuple[")


def _shown_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return None


def add_config_flags(parser: argparse.ArgumentParser, cls: type, title: str, description: str,
                     skip: tuple[str, ...] = (), aliases: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """Add a group of flags, one per field of dataclass `cls`; returns the field names added.

    `aliases` maps a field name to other spellings of its flag (vLLM's, e.g. --block-size)."""
    group = parser.add_argument_group(title, description)
    added = []
    for field in dataclasses.fields(cls):
        if field.name in skip or not field.init:
            continue
        help_text = field.metadata.get("help", "")
        default = _shown_default(field)
        kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS}
        shown = default not in (None, ()) and "default:" not in help_text.lower()
        kwargs["help"] = f"{help_text} (default: {default})" if shown else help_text
        if _is_bool(field):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            choices = field.metadata.get("choices")
            if choices:
                kwargs["choices"] = [str(c) for c in choices]
                kwargs["metavar"] = "{" + ",".join(str(c) for c in choices) + "}"
            else:
                kwargs["metavar"] = field.name.upper()
            if _is_tuple(field):
                kwargs["nargs"] = "+"
        group.add_argument(flag_of(field.name), *(aliases or {}).get(field.name, ()), **kwargs)
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
    """Build `cls` from parsed flag values (strings, lists of strings for tuple fields, or bools)."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        if name not in by_name:
            continue
        if isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, str):
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


def unknown_flags_message(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """'unrecognized arguments: ...' plus the nearest known flag for each misspelt one."""
    known = [s for s in parser._option_string_actions if s.startswith("--")]
    hints = {}
    for arg in unknown:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6) if name.startswith("--") else []
        if close:
            hints[name] = close[0]
    message = f"unrecognized arguments: {' '.join(unknown)}"
    if len(hints) == 1:
        return f"{message} (did you mean {next(iter(hints.values()))}?)"
    return message + (" (" + "; ".join(f"{k}: did you mean {v}?" for k, v in hints.items()) + ")" if hints else "")
