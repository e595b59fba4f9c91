"""Tokenizer loading and chat templates (in the caller's process; the core never tokenises text).

A Hugging Face folder loads with `AutoTokenizer`. A .gguf file carries its tokenizer in its metadata;
transformers converts it (several seconds), so the converted tokenizer is cached on disk keyed by the
file's path, size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..envs import ENVS


def _cache_root() -> Path | None:
    if ENVS.tokenizer_cache_dir == "off":
        return None
    if ENVS.tokenizer_cache_dir:
        return Path(ENVS.tokenizer_cache_dir)
    return Path.home() / ".cache" / "lightspeed" / "tokenizers"


def _load_gguf_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    root = _cache_root()
    cached = root / key if root else None
    if cached is not None and (cached / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(cached))
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if cached is not None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
            tokenizer.save_pretrained(str(tmp))
            os.replace(tmp, cached)  # atomic: concurrent loaders never see a half-written folder
        except OSError:
            pass  # a read-only cache only costs time
    return tokenizer


def resolve_model_path(model: str | None) -> str:
    """The model argument or, when None, the default model's path."""
    if model is not None:
        return model
    from ..model_files import default_model

    return str(default_model())


def _remote_tokenizer_class(folder: Path) -> str | None:
    """The class a folder's tokenizer_config.json maps AutoTokenizer to in its own code (`auto_map`),
    e.g. Kimi-K2's "tokenization_kimi.TikTokenTokenizer"; None for tokenizers transformers ships."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    auto = (config.get("auto_map") or {}).get("AutoTokenizer")
    if isinstance(auto, list):
        auto = next((a for a in auto if a), None)
    return auto or None


def _load_without_remote_code(folder: Path, remote_class: str) -> Any:
    """Remote-code tokenizers (Kimi-K2's tiktoken one) never run here: the folder's fast
    `tokenizer.json` is loaded directly (special tokens and chat template from its config)."""
    from transformers import PreTrainedTokenizerFast

    if not (folder / "tokenizer.json").is_file():
        found = "tiktoken.model, " if (folder / "tiktoken.model").is_file() else ""
        raise ValueError(
            f"{folder}: the tokenizer is remote code ({found}auto_map -> {remote_class} in tokenizer_config.json) "
            f"and Lightspeed does not execute remote code. Give --tokenizer a folder with a fast tokenizer.json "
            f"(and the tokenizer_config.json with its chat template), e.g. one converted from the tiktoken file "
            f"with transformers' TikTokenConverter.")
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def load_tokenizer(path: str | os.PathLike) -> Any:
    """A transformers tokenizer from a Hugging Face folder or a .gguf file (ValueError if neither).

    Never executes code from the folder: a tokenizer that ships as remote code (`auto_map`, e.g.
    Kimi-K2's tiktoken-based one) loads from its `tokenizer.json` or is refused with a message."""
    from transformers import AutoTokenizer

    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return _load_gguf_tokenizer(p)
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if not (p / "tokenizer_config.json").exists() and not (p / "tokenizer.json").exists() and ggufs:
            return _load_gguf_tokenizer(ggufs[0])
        remote = _remote_tokenizer_class(p)
        if remote is not None:
            return _load_without_remote_code(p, remote)
        return AutoTokenizer.from_pretrained(str(p), trust_remote_code=False)
    raise ValueError(f"no tokenizer at {str(path)!r}: expected a Hugging Face folder or a .gguf file")


def eos_token_ids(tokenizer: Any, model_path: str | os.PathLike | None = None) -> list[int]:
    """EOS ids: the tokenizer's plus those of generation_config.json / config.json beside the model."""
    ids: list[int] = []
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    if model_path is not None:
        folder = Path(model_path)
        folder = folder if folder.is_dir() else folder.parent
        for name in ("generation_config.json", "config.json"):
            f = folder / name
            if not f.exists():
                continue
            try:
                eos = json.loads(f.read_text()).get("eos_token_id")
            except (OSError, json.JSONDecodeError):
                continue
            for t in eos if isinstance(eos, list) else [eos]:
                if isinstance(t, int) and t not in ids:
                    ids.append(t)
    return ids


def apply_chat_template(tokenizer: Any, messages: list[dict], *, add_generation_prompt: bool = True,
                        tools: list[dict] | None = None, chat_template: str | None = None,
                        **template_kwargs: Any) -> list[int]:
    """Render `messages` with the tokenizer's chat template and tokenise; returns prompt token ids."""
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; pass chat_template=...")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         tools=tools, chat_template=chat_template, **template_kwargs)
    # The template already wrote BOS and friends: do not add special tokens a second time.
    return list(tokenizer(text, add_special_tokens=False).input_ids)
