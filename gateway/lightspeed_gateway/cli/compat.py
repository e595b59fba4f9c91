"""vLLM's `vllm serve` flags that `lightspeed serve` understands without being its own.

One table per kind:
- ALIASES: vLLM's spelling of a flag we have under another name (same meaning): the alias is an
  extra option string of our flag, so it validates and converts exactly like it. SWITCH_ALIASES are
  vLLM switches that mean "this field, this value" (--disable-log-stats).
- IGNORED: flags that are no-ops here (the behaviour is always on, or does not exist in this
  design): accepted, with one warning line each at start-up.
- UNSUPPORTED: flags whose meaning we do not have yet: a clear error instead of a silent change of
  behaviour. An entry whose flag a config field defines is skipped, so the field's own flag wins
  (as `--quantization` did once EngineConfig grew `quantization`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

# field name -> vLLM spellings of its flag
ALIASES: dict[str, tuple[str, ...]] = {
    "enable_prefix_cache": ("--enable-prefix-caching",),
    "page_size": ("--block-size",),
    "kv_cache_memory": ("--kv-cache-memory-bytes",),
    "log_level": ("--uvicorn-log-level",),
    "log_requests": ("--enable-log-requests",),
    "tensor_parallel_size": ("-tp",),
    "data_parallel_size": ("-dp",),
    "quantization": ("-q",),
}


# vLLM switches that set one of our fields to a fixed value: flag -> (field name, value as typed on a CLI)
SWITCH_ALIASES: dict[str, tuple[str, str]] = {
    "--disable-log-stats": ("log_stats_interval_s", "0"),
}


@dataclass(frozen=True)
class CompatFlag:
    """A vLLM flag with no flag of its own here."""

    flag: str            # e.g. "--trust-remote-code"
    takes_value: bool    # "--swap-space 4" (True) or a switch (False)
    reason: str          # why it is ignored / not supported, shown to the user


IGNORED: tuple[CompatFlag, ...] = (
    CompatFlag("--enable-auto-tool-choice", False,
               "tool calls are always parsed when a request has tools (see --tool-call-parser)"),
    CompatFlag("--trust-remote-code", False, "Lightspeed never runs code shipped with a checkpoint"),
    CompatFlag("--enable-chunked-prefill", False, "prefills are always chunked (see --chunked-prefill-size)"),
    CompatFlag("--no-enable-chunked-prefill", False, "prefills are always chunked (see --chunked-prefill-size)"),
    CompatFlag("--disable-log-requests", False, "requests are not logged unless --log-requests is given"),
    CompatFlag("--disable-frontend-multiprocessing", False, "the engine core always runs in its own process"),
    CompatFlag("--tokenizer-mode", True, "the tokenizer is always the fast (Rust) one"),
    CompatFlag("--swap-space", True, "the host KV tier is sized by --host-cache-memory"),
    CompatFlag("--max-seq-len-to-capture", True, "CUDA graphs are sized by --cuda-graph-max-batch-size"),
    CompatFlag("--distributed-executor-backend", True, "one engine core process per server"),
    CompatFlag("--disable-custom-all-reduce", False, "tensor-parallel all-reduces are torch.distributed's (NCCL)"),
    CompatFlag("--generation-config", True, "generation_config.json beside the model is always read"),
    CompatFlag("--chat-template-content-format", True, "message content is always rendered as text"),
)

UNSUPPORTED: tuple[CompatFlag, ...] = (
    CompatFlag("--enable-lora", False, "LoRA adapters are not supported"),
    CompatFlag("--lora-modules", True, "LoRA adapters are not supported"),
    CompatFlag("--pipeline-parallel-size", True, "pipeline parallelism is not supported"),
)

IGNORED_DEST = "_vllm_ignored"
UNSUPPORTED_DEST = "_vllm_unsupported"


class _Record(argparse.Action):
    """Remembers which compatibility flags were given (and their values) for the start-up report."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = dict(getattr(namespace, self.dest, None) or {})
        seen[option_string] = values
        setattr(namespace, self.dest, seen)


def add_compat_flags(parser: argparse.ArgumentParser) -> None:
    """Register SWITCH_ALIASES, IGNORED and UNSUPPORTED flags the parser does not define itself."""
    for flag, (field, value) in SWITCH_ALIASES.items():
        if flag not in parser._option_string_actions:
            parser.add_argument(flag, dest=field, action="store_const", const=value, default=argparse.SUPPRESS,
                                help=f"vLLM's spelling of --{field.replace('_', '-')} {value}")
    group = parser.add_argument_group("vLLM flags accepted for compatibility",
                                      "No effect here; each prints one warning at start-up.")
    for entry in IGNORED:
        if entry.flag not in parser._option_string_actions:
            group.add_argument(entry.flag, dest=IGNORED_DEST, action=_Record, nargs=1 if entry.takes_value else 0,
                               default=argparse.SUPPRESS, metavar="VALUE", help=f"no effect: {entry.reason}")
    for entry in UNSUPPORTED:
        if entry.flag not in parser._option_string_actions:
            parser.add_argument(entry.flag, dest=UNSUPPORTED_DEST, action=_Record,
                                nargs=1 if entry.takes_value else 0, default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS)


def _reason(flag: str, table: tuple[CompatFlag, ...]) -> str:
    return next(entry.reason for entry in table if entry.flag == flag)


def _shown(flag: str, values: list[str]) -> str:
    return " ".join([flag, *values])


def compat_warnings(args: argparse.Namespace) -> list[str]:
    """One line per ignored flag given (in the order given)."""
    seen = getattr(args, IGNORED_DEST, None) or {}
    return [f"{_shown(flag, values)} has no effect here: {_reason(flag, IGNORED)}" for flag, values in seen.items()]


def compat_error(args: argparse.Namespace) -> str | None:
    """The error for the first unsupported flag given, or None."""
    seen = getattr(args, UNSUPPORTED_DEST, None) or {}
    for flag, values in seen.items():
        return f"{_shown(flag, values)}: {_reason(flag, UNSUPPORTED)}"
    return None
