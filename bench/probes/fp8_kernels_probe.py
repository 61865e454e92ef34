"""GPU probe: the fp8 path's activation quantizations as Triton kernels (engine/kernels/fp8_triton.py) against
torch, eager and compiled, on one F1-sized pass of Qwen3-4B (16K tokens), with their errors.

- `silu_mul`: silu(gate) · up quantized per token (the down projection's input, 16K × 9728);
- `quantize`: per-token quantization of the attention output (the output projection's, 16K × 4096);
- `norm_quantize`: RMSNorm then quantization (q/k/v's and gate/up's input, 16K × 2560): compiled
  together, against the norm compiled and the Triton quantization after it.
Milliseconds by CUDA events, GB/s of compulsory traffic, and relative error of the dequantized
output against fp32. Writes fp8-kernels.json to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from quail.engine.kernels import fp8

from quail.engine.kernels import fp8_triton as fp8_kernels

from .timing import timed_ms

TOKENS, HIDDEN, HEADS_DIM, INTER = 16384, 2560, 4096, 9728


def rel_err(quantized: tuple[torch.Tensor, torch.Tensor], want: torch.Tensor) -> float:
    values, scale = quantized
    return float((values.float() * scale - want).norm() / want.norm())


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(x.dtype)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    torch.manual_seed(0)
    dev, bf16 = "cuda", torch.bfloat16
    gate, up = (torch.randn(TOKENS, INTER, device=dev, dtype=bf16) for _ in range(2))
    attn = torch.randn(TOKENS, HEADS_DIM, device=dev, dtype=bf16)
    x, weight = torch.randn(TOKENS, HIDDEN, device=dev, dtype=bf16), torch.rand(HIDDEN, device=dev)
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "tokens": TOKENS}
    cases = {
        "silu_mul": ((gate, up), fp8.silu_mul_rows, fp8_kernels.silu_mul_rows,
                     F.silu(gate.float()) * up.float(), 5 * TOKENS * INTER),
        "quantize": ((attn,), fp8.quantize_rows, fp8_kernels.quantize_rows, attn.float(), 3 * TOKENS * HEADS_DIM),
        "norm_quantize": ((x, weight), lambda a, w: fp8.quantize_rows(rms_norm(a, w)),
                          lambda a, w: fp8_kernels.quantize_rows(rms_norm_compiled(a, w)),
                          rms_norm(x, weight).float(), 3 * TOKENS * HIDDEN),
    }
    rms_norm_compiled = torch.compile(rms_norm)
    for name, (inputs, reference, kernel, want, traffic) in cases.items():
        compiled = torch.compile(reference)
        entry = {}
        for variant, fn in (("eager", reference), ("compiled", compiled), ("triton", kernel)):
            ms = timed_ms(lambda: fn(*inputs))
            entry[variant] = {"ms": ms, "gb_per_s": traffic / ms / 1e6, "rel_err": rel_err(fn(*inputs), want)}
        result[name] = entry
        print(name, json.dumps(entry), flush=True)
    Path(args.out, "fp8-kernels.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
