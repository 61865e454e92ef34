"""GPU probe: a layer's projections as separate GEMMs against one GEMM per input (H200, Qwen3-4B shape).

q, k and v read the same normed tokens, as gate and up do: one GEMM over the
concatenated weights does the same work in fewer, wider launches. Times both
ways on one F1-sized pass (16K tokens) in bf16 and in fp8 (`torch._scaled_mm`,
per-token and per-channel scales), with CUDA events over repeated calls.
Writes fused-gemm.json to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch

from .timing import timed_ms

HIDDEN, Q, KV, INTER = 2560, 4096, 1024, 9728
GROUPS = {"qkv": [Q, KV, KV], "gate_up": [INTER, INTER]}


def bf16_calls(x: torch.Tensor, weights: list[torch.Tensor]) -> tuple[Callable, Callable]:
    joined = torch.cat(weights)
    return (lambda: [x @ w.t() for w in weights]), (lambda: x @ joined.t())


def fp8_calls(x: torch.Tensor, weights: list[torch.Tensor]) -> tuple[Callable, Callable]:
    fp8 = torch.float8_e4m3fn
    top = torch.finfo(fp8).max
    xs = x.float().abs().amax(-1, keepdim=True) / top
    xq = (x.float() / xs).to(fp8)

    def quantized(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = w.float().abs().amax(-1, keepdim=True) / top
        return (w.float() / scale).to(fp8), scale.view(1, -1)

    parts = [quantized(w) for w in weights]
    joined = quantized(torch.cat(weights))

    def mm(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=scale, out_dtype=torch.bfloat16, use_fast_accum=True)

    return (lambda: [mm(*p) for p in parts]), (lambda: mm(*joined))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "tokens": args.tokens}
    for precision, calls in (("bf16", bf16_calls), ("fp8", fp8_calls)):
        for group, widths in GROUPS.items():
            weights = [torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02 for n in widths]
            separate, fused = calls(x, weights)
            flops = 2 * args.tokens * HIDDEN * sum(widths)
            ms = {"separate_ms": timed_ms(separate), "fused_ms": timed_ms(fused)}
            ms.update({f"{k[:-3]}_tflops": flops / v / 1e9 for k, v in list(ms.items())})
            result[f"{precision}-{group}"] = ms
            print(precision, group, json.dumps(ms), flush=True)
    Path(args.out, "fused-gemm.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
