"""FP8 block-scaled weights (DeepSeek-V3's checkpoint format) as layer transforms.

A weight `W [N, K]` is stored as e4m3 `q [N, K]` with one fp32 scale per 128x128 block,
`weight_scale_inv [ceil(N/128), ceil(K/128)]`, W = q * scale (the checkpoint's name: the inverse
of the quantisation scale). Activations are quantised per token and 128 columns at run time
(`quantize/fp8_per_block`), then `gemm/fp8_block` multiplies two e4m3 operands; MoE experts go
through `moe/fused_experts_fp8`.

Two ways in, both transforms on a built model (models never branch on quantisation):
- `convert_to_fp8(model)` before loading an FP8 checkpoint (or dummy weights): linear layers and
  fused experts get e4m3 weights and block-scale parameters the checkpoint fills;
- `quantize_to_fp8(model)` after loading a bf16 / fp32 checkpoint (`--quantization fp8`): each
  weight is quantised per block in place of the full-precision one.
Layers with `quantizable = False` (e.g. DeepSeek's MTP `eh_proj`, bf16 in the checkpoint) stay
unquantised.
"""

from __future__ import annotations

import torch
from lightspeed_kernel import ops
from torch import nn

from .linear import _LinearBase
from .moe import FusedMoE

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def quantize_weight_fp8(weight: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] float -> (e4m3 [..., N, K], fp32 scale [..., ceil(N/block), ceil(K/block)]).

    scale = amax of the block / 448, so the block's largest value maps to e4m3's largest."""
    *lead, n, k = weight.shape
    nb, kb = _cdiv(n, block), _cdiv(k, block)
    padded = weight.new_zeros(*lead, nb * block, kb * block, dtype=torch.float32)
    padded[..., :n, :k] = weight.float()
    blocks = padded.view(*lead, nb, block, kb, block)
    scale = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12) / FP8_MAX  # [..., nb, kb]
    q = (blocks / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(*lead, nb * block, kb * block)
    return q[..., :n, :k].to(FP8).contiguous(), scale


def dequantize_weight_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, block: int = BLOCK) -> torch.Tensor:
    """Inverse of `quantize_weight_fp8`: q [..., N, K] e4m3 with its block scales -> [..., N, K] `dtype`."""
    n, k = q.shape[-2:]
    full = scale.repeat_interleave(block, dim=-2)[..., :n, :].repeat_interleave(block, dim=-1)[..., :k]
    return (q.float() * full).to(dtype)


def _quantize_experts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per expert, so the fp32 staging copy is one expert's, not all of them (GBs for DeepSeek-V3)."""
    parts = [quantize_weight_fp8(w) for w in weight]
    return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])


class Fp8BlockLinearScheme:
    """Linear layers over e4m3 weights with 128x128 block scales."""

    @staticmethod
    def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        q, q_scale = ops.quant_fp8_per_block(x.reshape(-1, shape[-1]), BLOCK)  # [T, K] e4m3, [T, K/128]
        y = ops.fp8_block_gemm(q, q_scale, layer.weight, layer.weight_scale_inv, out_dtype=x.dtype)
        if bias is not None:
            y = y + bias
        return y.view(*shape[:-1], y.shape[-1])


class Fp8BlockMoEScheme:
    """Fused experts over e4m3 weights with 128x128 block scales."""

    @staticmethod
    def apply(layer: FusedMoE, x, topk_weights, topk_ids) -> torch.Tensor:
        return ops.fused_experts_fp8(x, layer.w13_weight, layer.w13_weight_scale_inv, layer.w2_weight,
                                     layer.w2_weight_scale_inv, topk_weights, topk_ids, activation="silu")


FP8_LINEAR, FP8_MOE = Fp8BlockLinearScheme(), Fp8BlockMoEScheme()


def _fp8_param(shape, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=FP8, device=device), requires_grad=False)


def _convert_linear(layer: _LinearBase) -> None:
    out_local, in_local = layer.weight.shape
    device = layer.weight.device
    if layer.parallel.tp_size > 1 and (out_local % BLOCK or in_local % BLOCK):
        raise ValueError(f"FP8 block weights under tensor parallelism need per-rank shapes in whole "
                         f"{BLOCK}-blocks, got [{out_local}, {in_local}]")
    weight = _fp8_param((out_local, in_local), device)
    weight.weight_loader = layer.weight_loader
    scale = nn.Parameter(torch.empty(_cdiv(out_local, BLOCK), _cdiv(in_local, BLOCK), dtype=torch.float32,
                                     device=device), requires_grad=False)
    scale.weight_loader = lambda p, loaded, shard_id=None: layer.weight_loader(p, loaded, shard_id, block=BLOCK)
    layer.weight, layer.weight_scale_inv, layer.scheme = weight, scale, FP8_LINEAR


def _convert_moe(layer: FusedMoE) -> None:
    e, two_i, h = layer.w13_weight.shape
    device = layer.w13_weight.device
    i = two_i // 2
    if i % BLOCK:
        # A checkpoint scales gate and up separately: their blocks line up in w13 only if I is whole blocks.
        raise ValueError(f"FP8 experts need moe_intermediate_size per rank in whole {BLOCK}-blocks, got {i}")
    for name, shape in (("w13", (e, two_i, h)), ("w2", (e, h, i))):
        weight = _fp8_param(shape, device)
        weight.weight_loader = layer.weight_loader
        scale = nn.Parameter(torch.empty(e, _cdiv(shape[1], BLOCK), _cdiv(shape[2], BLOCK), dtype=torch.float32,
                                         device=device), requires_grad=False)
        scale.weight_loader = layer.weight_loader
        setattr(layer, f"{name}_weight", weight)
        setattr(layer, f"{name}_weight_scale_inv", scale)
    layer.scheme = FP8_MOE


def _targets(model: nn.Module):
    for module in model.modules():
        if getattr(module, "quantizable", True) and isinstance(module, (_LinearBase, FusedMoE)):
            yield module


def convert_to_fp8(model: nn.Module) -> None:
    """Give every quantizable linear layer and fused-experts layer e4m3 weights + block scales
    (uninitialised), ready for an FP8 checkpoint's `weight` / `weight_scale_inv` tensors."""
    for module in list(_targets(model)):
        (_convert_moe if isinstance(module, FusedMoE) else _convert_linear)(module)


@torch.no_grad()
def quantize_to_fp8(model: nn.Module) -> None:
    """Quantise the loaded full-precision weights of every quantizable layer per 128x128 block."""
    for module in list(_targets(model)):
        if isinstance(module, FusedMoE):
            if module.scheme is FP8_MOE:
                continue
            for name in ("w13", "w2"):
                q, scale = _quantize_experts(getattr(module, f"{name}_weight"))
                setattr(module, f"{name}_weight", nn.Parameter(q, requires_grad=False))
                setattr(module, f"{name}_weight_scale_inv", nn.Parameter(scale, requires_grad=False))
            module.scheme = FP8_MOE
        elif module.scheme is not FP8_LINEAR:
            q, scale = quantize_weight_fp8(module.weight)
            module.weight = nn.Parameter(q, requires_grad=False)
            module.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
            module.scheme = FP8_LINEAR
