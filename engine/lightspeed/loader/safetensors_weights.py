"""Stream `(hf_name, tensor)` pairs out of safetensors files."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm


def iterate_safetensors(files: Sequence[Path], total: int | None = None,
                        progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every tensor of `files` (CPU), with a progress bar over tensors."""
    with tqdm(total=total, desc="Loading weights", unit="tensor", disable=not progress, leave=False) as bar:
        for path in files:
            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
                names = list(handle.keys())
            except (SafetensorError, OSError) as e:
                raise ValueError(f"{path}: cannot open safetensors file ({e})") from None
            for name in names:
                try:
                    tensor = handle.get_tensor(name)
                except (SafetensorError, OSError, RuntimeError) as e:
                    raise ValueError(f"{path}: cannot read tensor {name!r} ({e})") from None
                yield name, tensor
                bar.update(1)
