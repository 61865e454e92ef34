"""GPU probe: the SwiGLU block's SiLU·mul after the joined gate/up GEMM, by Inductor and by mlp_triton.

    python -m bench.probes.silu_mul_probe --out DIR

On one 16,280-token pass of the Qwen3-Embedding-0.6B and Qwen3-4B shapes (bf16):
torch's GEMM alone; Inductor's fused SiLU·mul (compiled for any token count:
the runner's way before mlp_triton); mlp_triton.silu_mul per block of columns
and warps, with its bandwidth (a read of the joined output, a write of the
product). Each variant's relative error against fp32 is reported beside its
milliseconds, and whether the kernel runs inside `torch.compile(dynamic=True)`
at two token counts. Writes silu-mul.json to --out. The 3c105cd run also timed
a GEMM with the product in its epilogue (bench/GPU_NOTES.md), since dropped.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from quail.engine.kernels import mlp_triton

from .timing import shapes_probe, sweep, timed_ms

TOKENS = 16280
SHAPES = {"qwen3-embedding-0.6b": (1024, 3072), "qwen3-4b": (2560, 9728)}
BLOCKS = [(1024, 4), (2048, 8), (512, 4), (256, 2), (4096, 8), (1024, 8)]  # columns a program, warps


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return round(float((got.float() - want).norm() / want.norm()), 6)


def compiles(fn, x: torch.Tensor) -> str:
    """'ok' when fn runs under torch.compile(dynamic=True) at two token counts and agrees with itself."""
    try:
        compiled = torch.compile(fn, dynamic=True)
        for rows in (x.shape[0], x.shape[0] // 3 + 1):
            torch.testing.assert_close(compiled(x[:rows]), fn(x[:rows]), rtol=2e-2, atol=2e-2)
        return "ok"
    except Exception as e:  # the probe reports why, and goes on
        return f"{type(e).__name__}: {str(e)[:300]}"


def probe(hidden: int, inter: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(TOKENS, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * inter, hidden, device="cuda", dtype=torch.bfloat16) * hidden ** -0.5
    gu32 = x.float() @ w.float().T
    want = F.silu(gu32[:, :inter]) * gu32[:, inter:]
    gu = x @ w.T
    inductor = torch.compile(lambda t: F.silu(t.chunk(2, -1)[0]) * t.chunk(2, -1)[1], dynamic=True)
    moved = TOKENS * inter * 3 * 2  # bytes: the joined output read, the product written
    out: dict = {"gemm_ms": timed_ms(lambda: x @ w.T), "inductor_ms": timed_ms(lambda: inductor(gu)),
                 "inductor_error": error(inductor(gu), want)}
    out["gemm_tflops"] = 2 * TOKENS * hidden * 2 * inter / out["gemm_ms"] / 1e9
    out["inductor_tb_per_s"] = moved / out["inductor_ms"] / 1e9
    out["silu_mul"] = sweep("cols", BLOCKS, lambda cols, warps: mlp_triton.silu_mul(gu, cols, num_warps=warps),
                            moved, lambda got: error(got, want))
    out["compiled"] = compiles(lambda t: mlp_triton.silu_mul(t @ w.T), x)
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    shapes_probe("python -m bench.probes.silu_mul_probe", __doc__.split("\n")[0], TOKENS, "silu-mul.json",
                 {name: lambda shape=shape: probe(*shape) for name, shape in SHAPES.items()}, argv)


if __name__ == "__main__":
    main()
