"""Environment variables of the engine, read once, in one typed place.

Every variable Lightspeed's engine reads is a field of :class:`Envs`; `ENVS` is the snapshot taken
at import. Nothing else in the engine touches ``os.environ`` (child processes get a copy of the
parent's environment, so they see the same values).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _positive_int(name: str, default: int) -> int:
    value = _int(name, default)
    if value < 1:
        raise ValueError(f"environment variable {name}={value} must be >= 1")
    return value


def _choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() not in choices:
        raise ValueError(f"environment variable {name}={raw!r} is not one of {', '.join(choices)}")
    return raw.lower()


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None


STEP_IO_MODES = ("kernel", "stream", "compute")  # LIGHTSPEED_STEP_IO, first the default


@dataclass(frozen=True)
class Envs:
    log_level: str = field(default="INFO", metadata={"env": "LIGHTSPEED_LOG_LEVEL"})
    """Log level of the engine core process (DEBUG, INFO, WARNING, ...)."""
    rpc_base_dir: str | None = field(default=None, metadata={"env": "LIGHTSPEED_RPC_BASE_DIR"})
    """Folder under which the ipc:// socket folder of each engine is made (default: system temp)."""
    engine_ready_timeout_s: float = field(default=600.0, metadata={"env": "LIGHTSPEED_ENGINE_READY_TIMEOUT_S"})
    """Seconds the client waits for the engine core to load the model and report ready."""
    engine_poll_interval_s: float = field(default=0.5, metadata={"env": "LIGHTSPEED_ENGINE_POLL_INTERVAL_S"})
    """How often the client checks that the engine core process is still alive while it waits."""
    num_threads: int | None = field(default=None, metadata={"env": "LIGHTSPEED_NUM_THREADS"})
    """torch intra-op threads of the engine core on CPU (default: torch's choice)."""
    tokenizer_cache_dir: str | None = field(default=None, metadata={"env": "LIGHTSPEED_TOKENIZER_CACHE"})
    """Where tokenizers converted from GGUF files are cached (default ~/.cache/lightspeed/tokenizers;
    "off" disables the cache)."""
    distributed_timeout_s: float = field(default=1800.0, metadata={"env": "LIGHTSPEED_DISTRIBUTED_TIMEOUT_S"})
    """Seconds a torch.distributed rank waits for the others (rendezvous, and a collective such as the
    one after the slowest rank's model load) before it fails."""
    # torchrun's / the usual launchers' variables: defaults of --master-addr, --master-port,
    # --node-rank and --nnodes (`NNODES`, else WORLD_SIZE / LOCAL_WORLD_SIZE of a one-process-per-node launch).
    master_addr: str | None = field(default=None, metadata={"env": "MASTER_ADDR"})
    master_port: int | None = field(default=None, metadata={"env": "MASTER_PORT"})
    node_rank: int | None = field(default=None, metadata={"env": "NODE_RANK or GROUP_RANK"})
    nnodes: int | None = field(default=None, metadata={"env": "NNODES or WORLD_SIZE / LOCAL_WORLD_SIZE"})
    write_through_mib: int = field(default=512, metadata={"env": "LIGHTSPEED_WRITE_THROUGH_MIB"})
    """MiB of prefix pages in flight to the host KV tier at once (runner/factory.py). Acknowledged once a step,
    so it also caps the write-through at this much per step."""
    step_io: str = field(default="kernel", metadata={"env": "LIGHTSPEED_STEP_IO"})
    """How a step's inputs reach the GPU and its sampled tokens the host (runner/step_io.py): `kernel` (the default:
    a Triton kernel through pinned memory, never queued behind the KV host tier's copies), `stream` (copy-engine
    copies, results on their own stream; also what `kernel` falls back to where its probe fails) or `compute`
    (copy-engine copies on the compute stream, for A/B runs)."""


def _nnodes() -> int | None:
    explicit = _int("NNODES", None)
    if explicit is not None:
        return explicit
    world, local = _int("WORLD_SIZE", None), _int("LOCAL_WORLD_SIZE", None)
    return world // local if world and local else None


def load_envs() -> Envs:
    return Envs(
        log_level=os.environ.get("LIGHTSPEED_LOG_LEVEL", "INFO").upper(),
        rpc_base_dir=os.environ.get("LIGHTSPEED_RPC_BASE_DIR") or None,
        engine_ready_timeout_s=_float("LIGHTSPEED_ENGINE_READY_TIMEOUT_S", 600.0),
        engine_poll_interval_s=_float("LIGHTSPEED_ENGINE_POLL_INTERVAL_S", 0.5),
        num_threads=_int("LIGHTSPEED_NUM_THREADS", None),
        tokenizer_cache_dir=os.environ.get("LIGHTSPEED_TOKENIZER_CACHE") or None,
        distributed_timeout_s=_float("LIGHTSPEED_DISTRIBUTED_TIMEOUT_S", 1800.0),
        master_addr=os.environ.get("MASTER_ADDR") or None,
        master_port=_int("MASTER_PORT", None),
        node_rank=_int("NODE_RANK", _int("GROUP_RANK", None)),
        nnodes=_nnodes(),
        step_io=_choice("LIGHTSPEED_STEP_IO", STEP_IO_MODES[0], STEP_IO_MODES),
        write_through_mib=_positive_int("LIGHTSPEED_WRITE_THROUGH_MIB", 512),
    )


ENVS = load_envs()
