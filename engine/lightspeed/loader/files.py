"""Find what a model argument names: a HF directory, a GGUF file (or a directory holding one),
or, for dummy loading, a config.json / directory / preset name."""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

LOAD_FORMATS = ("auto", "hf", "gguf", "dummy")


@dataclass(frozen=True)
class ModelFiles:
    """The resolved files of one model."""

    load_format: str  # "hf", "gguf" or "dummy"
    root: Path | None  # the model directory (None for a preset)
    config_path: Path | None = None  # config.json (hf; dummy from a file)
    weight_files: tuple[Path, ...] = ()  # *.safetensors (hf) or the .gguf file (gguf)
    generation_config_path: Path | None = None
    preset: str | None = None  # dummy from a built-in preset
    tensor_counts: tuple[int, ...] = field(default=(), repr=False)  # tensors per weight file (hf)

    @property
    def gguf_file(self) -> Path | None:
        return self.weight_files[0] if self.load_format == "gguf" else None


def resolve_model_files(model: str | Path, load_format: str = "auto") -> ModelFiles:
    """Resolve `model` (path or preset name) for `load_format`; ValueError with the reason otherwise."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    path = Path(model).expanduser()
    if load_format == "dummy":
        return _resolve_dummy(str(model), path)
    if not path.exists():
        raise ValueError(_hub_hint(str(model)) or f"model path {str(path)!r} does not exist (give a local "
                         "directory or .gguf file, or --load-format dummy with a preset)")
    gguf = find_gguf(path)
    if load_format == "gguf" or (load_format == "auto" and gguf is not None and not (path / "config.json").is_file()):
        if gguf is None:
            raise ValueError(f"no .gguf file at {path}")
        return ModelFiles("gguf", gguf.parent, weight_files=(gguf,))
    return _resolve_hf(path)


def find_gguf(path: Path) -> Path | None:
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"{path} holds several .gguf files ({', '.join(p.name for p in found)}); name one")
    return found[0] if found else None


def _resolve_hf(path: Path) -> ModelFiles:
    if not path.is_dir():
        raise ValueError(f"{path} is neither a model directory nor a .gguf file")
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"{path} has no config.json")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: malformed safetensors index ({e})") from None
        files = [path / name for name in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} names missing weight files: {', '.join(missing)}")
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        hint = " (only PyTorch .bin weights found; convert them to safetensors)" if any(path.glob("*.bin")) else ""
        raise ValueError(f"{path} has no *.safetensors weights{hint}")
    counts = tuple(check_safetensors(f) for f in files)
    gen = path / "generation_config.json"
    return ModelFiles("hf", path, config, tuple(files), gen if gen.is_file() else None, tensor_counts=counts)


def _resolve_dummy(name: str, path: Path) -> ModelFiles:
    from ..models.presets import PRESETS, preset_names

    if path.is_file():
        return ModelFiles("dummy", path.parent, config_path=path)
    if path.is_dir() and (path / "config.json").is_file():
        gen = path / "generation_config.json"
        return ModelFiles("dummy", path, path / "config.json", generation_config_path=gen if gen.is_file() else None)
    if name in PRESETS:
        return ModelFiles("dummy", None, preset=name)
    raise ValueError(f"dummy model {name!r} is neither a config.json path, a directory with one, "
                     f"nor a preset ({', '.join(preset_names())})" + (f"; {_hub_hint(name)}" if _hub_hint(name) else ""))


def _hub_hint(name: str) -> str:
    """A note for names shaped like a Hugging Face hub id ("Qwen/Qwen3-0.6B"): they are not fetched."""
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name) and not name.startswith("."):
        return (f"{name!r} is not a local path; it looks like a Hugging Face hub id, but Lightspeed loads "
                f"local files only: download it (`huggingface-cli download {name} --local-dir DIR`) and pass DIR")
    return ""


def check_safetensors(path: Path) -> int:
    """Validate a safetensors file's header against its size; returns its tensor count."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(f.read(header_len))
        ends = [info["data_offsets"][1] for key, info in header.items() if key != "__metadata__"]
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a valid safetensors file ({e})") from None
    data_size = size - 8 - header_len
    if ends and max(ends) > data_size:
        raise ValueError(f"{path}: truncated safetensors file ({data_size} data bytes, header needs {max(ends)})")
    return len(ends)


_IDENTITY_SPAN = 1 << 20  # bytes hashed at each end of a weight file


def weights_identity(files: ModelFiles, seed: int, dummy_weights: str = "normal") -> dict:
    """What the weights are, cheaply: each weight file's name, size and a CRC-32 of its first and last
    MiB (content, so a copied file is the same model and an edited one is not); for dummy weights,
    the config they are drawn from, the distribution and the seed. Part of the disk KV cache's fingerprint."""
    if files.load_format == "dummy":
        config = files.config_path.read_text() if files.config_path is not None else files.preset
        identity = {"dummy": True, "config": config, "seed": seed}
        if dummy_weights != "normal":  # the normal draw keeps the fingerprint of earlier disk caches
            identity["distribution"] = dummy_weights
        return identity
    identity = []
    for path in files.weight_files:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = zlib.crc32(f.read(_IDENTITY_SPAN))
            f.seek(max(0, size - _IDENTITY_SPAN))
            tail = zlib.crc32(f.read(_IDENTITY_SPAN))
        identity.append([path.name, size, head, tail])
    return {"format": files.load_format, "files": identity}
