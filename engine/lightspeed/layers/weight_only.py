"""Weight-only quantisation as a transform of a built model, before its weights load.

`quantize_weights(model, formats)` swaps the float ``weight`` of each linear / embedding / LM-head
layer named in `formats` for an empty `QuantizedWeight` (lightspeed_kernel) of that format.
Nothing else changes: the layer's forward still calls ``ops.linear`` / ``ops.embedding``, which
dispatch on the weight's type to the gemm/w4 and gemm/w8 kernels, and its ``weight_loader`` still
routes checkpoint shards, because a QuantizedWeight narrows by rows and copies like a tensor
(quantising float sources, copying GGUF blocks exactly). Tied weights stay tied.

Schemes (``EngineConfig.quantization`` after "auto" is resolved):
- ``int8`` / ``int4``: every eligible weight in w8 / w4 (group 32; 16 where the source's own
  groups are 16). Sources that fit (fewer bits, compatible groups) are copied exactly; the rest
  are requantised and the error is reported.
- ``gguf``: every weight of a GGUF file in the format that holds its blocks exactly (4-bit types
  in w4, 5- to 8-bit types in w8); weights stored as floats (or in block types without an exact
  mapping) stay float.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from lightspeed_kernel import QuantizedWeight
from torch import nn

from .embedding import VocabParallelEmbedding
from .linear import _LinearBase

WEIGHT_SCHEMES = ("none", "int8", "int4", "gguf")

WeightFormat = tuple[int, int]  # (bits, group_size)
SourceFormat = WeightFormat | None  # a checkpoint tensor's own quantised format; None = float


def quantizable_weights(model: nn.Module) -> dict[str, nn.Parameter]:
    """Parameter name -> weight of every linear, embedding and LM-head layer (tied ones once)."""
    found: dict[str, nn.Parameter] = {}
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, (_LinearBase, VocabParallelEmbedding)):
            weight = module.weight
            if isinstance(weight, nn.Parameter) and weight.dim() == 2 and id(weight) not in seen:
                seen.add(id(weight))
                found[f"{prefix}.weight" if prefix else "weight"] = weight
    return found


def choose_format(scheme: str, sources: Iterable[SourceFormat]) -> WeightFormat | None:
    """The format a weight gets under `scheme`, given the formats of the checkpoint tensors that
    fill it (a fused QKV layer has three); None = keep it float."""
    sources = list(sources)
    quantized = [s for s in sources if s is not None]
    if scheme == "gguf":
        if not sources or len(quantized) < len(sources):
            return None
        return max(bits for bits, _ in quantized), min(group for _, group in quantized)
    if scheme in ("int8", "int4"):
        bits = 8 if scheme == "int8" else 4
        fitting = [group for source_bits, group in quantized if source_bits <= bits]
        return bits, min([32, *fitting])
    if scheme == "none":
        return None
    raise ValueError(f"unknown weight quantisation scheme {scheme!r} (one of {', '.join(WEIGHT_SCHEMES)})")


def plan_formats(model: nn.Module, scheme: str, sources: Mapping[str, list[SourceFormat]]) -> dict[str, WeightFormat]:
    """Parameter name -> format for every eligible weight under `scheme`. `sources` holds the
    checkpoint formats feeding each parameter (missing: one float source)."""
    plan = {}
    for name, weight in quantizable_weights(model).items():
        chosen = choose_format(scheme, sources.get(name, [None]))
        in_features = weight.shape[1]
        if chosen is not None and in_features % 32 == 0 and in_features % chosen[1] == 0:
            plan[name] = chosen
    return plan


def quantize_weights(model: nn.Module, formats: Mapping[str, WeightFormat]) -> dict[str, QuantizedWeight]:
    """Replace each named float weight by an empty QuantizedWeight (same device, weight_loader and
    logical dtype); every module that shared the parameter gets the same QuantizedWeight."""
    params = quantizable_weights(model)
    unknown = sorted(set(formats) - set(params))
    if unknown:
        raise ValueError(f"cannot quantise {', '.join(unknown)}: not a linear / embedding weight of the model")
    replaced: dict[int, QuantizedWeight] = {}
    result = {}
    for name, (bits, group) in formats.items():
        old = params[name]
        new = QuantizedWeight.empty(old.shape[0], old.shape[1], bits, group, device=old.device, dtype=old.dtype)
        if hasattr(old, "weight_loader"):
            new.weight_loader = old.weight_loader
        replaced[id(old)] = result[name] = new
    for module in model.modules():
        for attr, param in list(module._parameters.items()):
            if param is not None and id(param) in replaced:
                del module._parameters[attr]
                setattr(module, attr, replaced[id(param)])
    return result


def named_weights(model: nn.Module) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Every weight a checkpoint fills: the parameters plus the quantised weights (tied ones once)."""
    weights: dict[str, torch.Tensor | QuantizedWeight] = dict(model.named_parameters())
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, QuantizedWeight) and id(value) not in seen:
                seen.add(id(value))
                weights[f"{prefix}.{attr}" if prefix else attr] = value
    return weights


@dataclass(frozen=True)
class QuantizationReport:
    """How the quantised weights of a loaded model relate to their checkpoint tensors."""

    formats: dict[str, str]  # weight name -> "w4/g32", ...
    requantized: dict[str, float]  # weight name -> largest relative error of its requantised parts
    quantized_bytes: int
    float_bytes: int  # what the same weights would take as float32

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for fmt in self.formats.values():
            counts[fmt] = counts.get(fmt, 0) + 1
        kinds = ", ".join(f"{n} {fmt}" for fmt, n in sorted(counts.items()))
        text = (f"{len(self.formats)} quantised weights ({kinds}), {self.quantized_bytes / 2**20:.1f} MiB "
                f"(float32: {self.float_bytes / 2**20:.1f} MiB)")
        if self.requantized:
            worst = max(self.requantized, key=self.requantized.get)
            text += (f"; {len(self.requantized)} requantised from their checkpoint format, largest relative "
                     f"error {self.requantized[worst]:.2%} ({worst})")
        else:
            text += "; every one copied exactly from its checkpoint blocks"
        return text


def quantization_report(model: nn.Module) -> QuantizationReport:
    """Formats, requantisation errors and sizes of the model's quantised weights (after loading)."""
    formats, requantized, q_bytes, f_bytes = {}, {}, 0, 0
    for name, weight in named_weights(model).items():
        if not isinstance(weight, QuantizedWeight):
            continue
        formats[name] = weight.format
        q_bytes += weight.nbytes
        f_bytes += weight.shape[0] * weight.shape[1] * 4
        errors = [r.rel_error for r in weight.copy_log if not r.exact]
        if errors:
            requantized[name] = max(errors)
    return QuantizationReport(formats, requantized, q_bytes, f_bytes)
