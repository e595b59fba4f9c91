"""Tokenizer loading and chat templates (in the caller's process; the core never tokenises text).

A Hugging Face folder loads with `AutoTokenizer`. A .gguf file carries its tokenizer in its metadata;
transformers converts it (several seconds), so the converted tokenizer is cached on disk keyed by the
file's path, size and mtime. A dummy model (a preset, or a folder holding only config.json) has no
tokenizer files: it gets a byte-level tokenizer sized to its vocabulary, so it serves text out of
the box. Whatever the source, the tokenizer's ids must fit the model's vocabulary (`check_vocab`).
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


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def has_tokenizer(path: str | os.PathLike) -> bool:
    """True when `path` is a .gguf file or a folder holding tokenizer files or a .gguf file."""
    p = Path(path)
    if p.is_file():
        return p.suffix == ".gguf"
    return p.is_dir() and (any((p / name).is_file() for name in _TOKENIZER_FILES) or any(p.glob("*.gguf")))


def import_tokenizer_libraries() -> None:
    """Import what `load_tokenizer` uses (transformers, which imports torch, and tokenizers) now. For a
    caller that must not be interrupted while those extensions initialise: `lightspeed serve` imports them
    while a signal still exits at once, before it loads the model under a KeyboardInterrupt handler."""
    import tokenizers  # noqa: F401
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401


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
        if not has_tokenizer(p):
            raise ValueError(f"{p} has no tokenizer ({', '.join(_TOKENIZER_FILES[:2])} or a .gguf file); "
                             "name one with --tokenizer")
        remote = _remote_tokenizer_class(p)
        if remote is not None:
            return _load_without_remote_code(p, remote)
        return AutoTokenizer.from_pretrained(str(p), trust_remote_code=False)
    raise ValueError(f"no tokenizer at {str(path)!r}: expected a Hugging Face folder or a .gguf file")


def tokenizer_source(config: Any) -> str | None:
    """Where an engine's tokenizer comes from: `config.tokenizer`, else the model's own files; None
    for a dummy model without tokenizer files (a preset, or a folder with only config.json)."""
    if config.tokenizer is not None:
        return config.tokenizer
    model = resolve_model_path(config.model)
    if config.load_format != "dummy":
        return model
    folder = Path(model).expanduser()
    folder = folder.parent if folder.is_file() else folder
    return str(folder) if has_tokenizer(folder) else None


def load_engine_tokenizer(config: Any, vocab_size: int) -> Any:
    """The tokenizer of the engine `config` describes (the byte-level fallback when it has none),
    checked against the model's vocabulary."""
    source = tokenizer_source(config)
    tokenizer = load_tokenizer(source) if source is not None else byte_level_tokenizer(vocab_size)
    check_vocab(tokenizer, vocab_size, source)
    return tokenizer


def check_vocab(tokenizer: Any, vocab_size: int, source: str | None) -> None:
    """ValueError when the tokenizer can produce ids the model has no embedding for."""
    if len(tokenizer) > vocab_size:
        where = f"the tokenizer of {source}" if source else "the tokenizer"
        raise ValueError(f"{where} has {len(tokenizer)} tokens but the model's vocabulary has {vocab_size}: "
                         "name a matching tokenizer with --tokenizer")


# A plain role-tagged transcript: each rendering extends the previous one, as the chat renderer wants.
_FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (the ByteLevel decoder's inverse)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars, strict=True)}


def byte_level_tokenizer(vocab_size: int) -> Any:
    """A tokenizer for models without one (random-weight benchmarks): id b < 256 is byte b, every
    higher id decodes to `<|reserved_ID|>`, so any id the model samples is text and any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256:
        raise ValueError(f"the model's vocabulary has {vocab_size} tokens, too few for the byte-level fallback "
                         "tokenizer (256 needed): name a tokenizer with --tokenizer")
    vocab = {char: byte for byte, char in _byte_to_unicode().items()}
    vocab.update({f"<|reserved_{i}|>": i for i in range(256, vocab_size)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.chat_template = _FALLBACK_CHAT_TEMPLATE
    return tokenizer


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
