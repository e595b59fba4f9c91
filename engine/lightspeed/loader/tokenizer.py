"""Hugging Face fast tokenizers for a HF model directory or a GGUF file (built from its metadata)."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: str | Path):
    """A `transformers` fast tokenizer for a HF directory, a .gguf file or a directory holding one.

    Its `chat_template` attribute holds the model's chat template (from tokenizer_config.json or
    the GGUF's `tokenizer.chat_template`), or None.
    """
    from transformers import AutoTokenizer

    from .files import _find_gguf

    path = Path(path).expanduser()
    if not path.exists():
        raise ValueError(f"tokenizer path {str(path)!r} does not exist")
    gguf = None if path.is_dir() and (path / "tokenizer.json").is_file() else _find_gguf(path)
    try:
        if gguf is not None:
            return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {path}: {e}") from None
