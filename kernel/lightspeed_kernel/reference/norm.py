"""RMSNorm references. Statistics and scaling in fp32, one rounding to the input dtype at the end."""

from __future__ import annotations

import torch

from ._register import reference


@reference("norm", "rms")
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    # x: [T, H], weight: [H]
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    if out is None:
        return normed.to(x.dtype)
    return out.copy_(normed)


@reference("norm", "fused_add_rms")
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # x, residual: [T, H]. The sum is rounded to the residual dtype first and the norm is taken of
    # that rounded value: the same numbers an unfused add + rms_norm would give. The new residual
    # is written into `residual` (implementations may do so; the reference does, so callers that
    # wrongly reuse the old residual fail on the CPU too).
    summed = (x.float() + residual.float()).to(residual.dtype)
    residual.copy_(summed)
    return rms_norm(residual, weight, eps), residual


@reference("norm", "rms_linear")
def rms_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The unfused numbers: the norm rounds to x's dtype, then the projection in fp32, rounded once.
    if residual is None:
        normed, h = rms_norm(x, norm_weight, eps), x
    else:
        normed, h = fused_add_rms_norm(x, residual, norm_weight, eps)
    out = normed.float() @ weight.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype), h
