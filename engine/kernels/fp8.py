"""fp8 (e4m3) linear layers: per-output-channel weight scales, dynamic per-token activation scales."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:
    from quail.engine.kernels import fp8_triton as fp8_kernels  # Triton, with CUDA builds of torch
except ImportError:
    fp8_kernels = None

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
        out = self.product(*quantize_rows(rows), x.dtype)
        return out.view(*x.shape[:-1], out.shape[-1])

    def product(self, values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The layer applied to rows already quantized (values · scale), output (rows, out) in `dtype`."""
        return torch._scaled_mm(values, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, bias=self.bias,
                                out_dtype=dtype, use_fast_accum=True)


def project(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """linear(x) for rows x (tokens, k); fp8 on CUDA: x quantized by one Triton pass. For inputs that no
    compiled kernel produces (the attention output); a norm before a layer fuses its quantization."""
    if isinstance(linear, Fp8Linear) and x.is_cuda and fp8_kernels is not None:
        return linear.product(*fp8_kernels.quantize_rows(x), x.dtype)
    return linear(x)


def silu_mul_project(linear: nn.Module, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """linear(silu(gate) · up); fp8 on CUDA: SiLU·mul and the quantization in one Triton pass, the
    product never written."""
    if isinstance(linear, Fp8Linear) and gate.is_cuda and fp8_kernels is not None:
        return linear.product(*fp8_kernels.silu_mul_rows(gate, up), gate.dtype)
    return linear(F.silu(gate) * up)


def to_fp8(module: nn.Module) -> None:
    """Replace every nn.Linear below `module` by its fp8 version, in place (frees the originals)."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Fp8Linear(child))
        else:
            to_fp8(child)
