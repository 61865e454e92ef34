"""fp8 (e4m3) linear layers: per-output-channel weight scales, dynamic per-token activation scales."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, k) → fp8 values and one fp32 scale per row (rows, 1): x ≈ values · scale."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def silu_mul_rows(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(gate) · up (rows, k) quantized per row, as quantize_rows."""
    return quantize_rows(F.silu(gate) * up)


class Fp8Linear(nn.Module):
    """y = x Wᵀ (+ b) through `torch._scaled_mm` with fast accumulation, output in x's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight, scale = quantize_rows(linear.weight.detach())
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", scale.view(1, -1))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        values, scale = quantize_rows(rows)
        out = torch._scaled_mm(values, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, bias=self.bias,
                               out_dtype=x.dtype, use_fast_accum=True)
        return out.view(*x.shape[:-1], out.shape[-1])


def to_fp8(module: nn.Module) -> None:
    """Replace every nn.Linear below `module` by its fp8 version, in place (frees the originals)."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Fp8Linear(child))
        else:
            to_fp8(child)
