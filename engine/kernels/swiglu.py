"""The SwiGLU block's output down(silu(gate) · up), by the fastest path the device and the weights allow."""

from __future__ import annotations

import torch
from torch import nn

from quail.engine.kernels.fp8 import silu_mul_project

try:
    from quail.engine.kernels import mlp_triton as mlp_kernels  # Triton, with CUDA builds of torch
except ImportError:
    mlp_kernels = None


def swiglu(gate_up: nn.Module, down: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down(silu(gate) · up) for [gate | up] = gate_up(x), x (tokens, hidden).

    - bf16/fp16 on CUDA: torch's GEMMs, the product between them by one Triton pass (mlp_triton).
    - fp8 weights: fp8.silu_mul_project (the product and its quantization in one pass).
    - Elsewhere (the CPU, fp32): torch.
    """
    if mlp_kernels is not None and x.is_cuda and type(gate_up) is nn.Linear and x.dtype in (torch.bfloat16,
                                                                                             torch.float16):
        return down(mlp_kernels.silu_mul(gate_up(x)))
    return silu_mul_project(down, *gate_up(x).chunk(2, dim=-1))
