"""GPU probe: a layer's output projections with the residual added (x + a·Wᵀ), by the ways torch offers.

    python -m bench.probes.residual_gemm_probe --out DIR

On one 16,280-token pass (bf16) of the Qwen3-Embedding-0.6B shape (hidden 1,024: the attention output's
2,048 columns and the MLP's 3,072 projected back) and the Qwen3-4B shape (hidden 2,560: 4,096 and 9,728):
`torch.addmm(x, a, w.T)` (Inductor's choice for x + a @ w.T: the residual copied into the output, then
one GEMM adding to it), the GEMM alone, the GEMM then the add (two kernels), and the in-place
`x.addmm_(a, w.T)` (no copy). Milliseconds and TFLOP/s of each; writes residual-gemm.json to --out.
"""

from __future__ import annotations

import json

import torch

from .timing import shapes_probe, timed_ms

TOKENS = 16280
SHAPES = {"qwen3-embedding-0.6b": (1024, (2048, 3072)), "qwen3-4b": (2560, (4096, 9728))}


def probe(hidden: int, inner: int) -> dict:
    torch.manual_seed(0)
    a = torch.randn(TOKENS, inner, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(hidden, inner, device="cuda", dtype=torch.bfloat16) * inner ** -0.5
    x = torch.randn(TOKENS, hidden, device="cuda", dtype=torch.bfloat16)
    flops = 2 * TOKENS * hidden * inner
    ways = {"addmm": lambda: torch.addmm(x, a, w.T), "mm": lambda: a @ w.T, "mm_then_add": lambda: a @ w.T + x,
            "addmm_in_place": lambda: x.addmm_(a, w.T)}
    out = {name: {"ms": timed_ms(fn)} for name, fn in ways.items()}
    for entry in out.values():
        entry["tflops"] = flops / entry["ms"] / 1e9
    print(hidden, inner, json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    shapes_probe("python -m bench.probes.residual_gemm_probe", __doc__.split("\n")[0], TOKENS, "residual-gemm.json",
                 {f"{name} {hidden}x{inner}": lambda hidden=hidden, inner=inner: probe(hidden, inner)
                  for name, (hidden, inners) in SHAPES.items() for inner in inners}, argv)


if __name__ == "__main__":
    main()
