"""Speculative decoding: drafters (ngram / suffix on the CPU, MTP / EAGLE-3 on the device) and
lossless verification in the sampler. The runner holds one `SpecDecoder` (see decoder.py)."""

from .config import MAX_SPECULATIVE_TOKENS, METHODS, SpeculativeConfig

__all__ = ["MAX_SPECULATIVE_TOKENS", "METHODS", "SpeculativeConfig"]
