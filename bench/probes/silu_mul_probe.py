"""GPU probe: the SwiGLU block's front half — joined gate/up GEMM, then silu(gate) · up — done three ways.

    python -m bench.probes.silu_mul_probe --out DIR

On one 16,280-token pass of the Qwen3-Embedding-0.6B and Qwen3-4B shapes (bf16):
- `cublas+inductor`: torch's GEMM, then Inductor's fused SiLU·mul (compiled, dynamic shapes: the runner's way);
- `cublas+triton`: torch's GEMM, then mlp_triton.silu_mul, per block size and warps;
- `fused`: mlp_triton.gate_up_silu (the product in the GEMM's epilogue), per tile and launch setting.
Each variant's relative error against fp32 is reported beside its milliseconds, and whether each Triton
call runs inside `torch.compile(dynamic=True)` at two token counts. Writes silu-mul.json to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from quail.engine.kernels import mlp_triton

from .timing import timed_ms

TOKENS = 16280
SHAPES = {"qwen3-embedding-0.6b": (1024, 3072), "qwen3-4b": (2560, 9728)}
BLOCKS = [(1, 1024, 4), (2, 1024, 4), (4, 512, 4), (8, 256, 4), (4, 1024, 8), (8, 512, 8), (16, 256, 8),
          (1, 2048, 8), (32, 128, 4)]
TILES = [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3),
         dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
         dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4),
         dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3),
         dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4),
         dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, num_warps=8, num_stages=3),
         dict(BLOCK_M=256, BLOCK_N=64, BLOCK_K=64, num_warps=8, num_stages=3),
         dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_warps=8, num_stages=5)]


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
    out: dict = {"gemm_ms": timed_ms(lambda: x @ w.T), "gemm_tflops": 2 * TOKENS * hidden * 2 * inter / 1e9,
                 "inductor_ms": timed_ms(lambda: inductor(gu)), "inductor_error": error(inductor(gu), want),
                 "silu_mul": [], "fused": []}
    out["gemm_tflops"] /= out["gemm_ms"]
    for rows, cols, warps in BLOCKS:
        got = mlp_triton.silu_mul(gu, rows, cols, num_warps=warps)
        ms = timed_ms(lambda: mlp_triton.silu_mul(gu, rows, cols, num_warps=warps))
        out["silu_mul"].append({"rows": rows, "cols": cols, "warps": warps, "ms": ms,
                                "tb_per_s": TOKENS * inter * 3 * 2 / ms / 1e9, "error": error(got, want)})
    for tile in TILES:
        try:
            got = mlp_triton.gate_up_silu(x, w, **tile)
            ms = timed_ms(lambda: mlp_triton.gate_up_silu(x, w, **tile))
            out["fused"].append({**tile, "ms": ms, "tflops": 4 * TOKENS * hidden * inter / ms / 1e9,
                                 "error": error(got, want)})
        except Exception as e:  # a tile that does not fit the device's shared memory
            out["fused"].append({**tile, "failed": f"{type(e).__name__}: {str(e)[:200]}"})
    out["compiled_silu_mul"] = compiles(lambda t: mlp_triton.silu_mul(t @ w.T), x)
    out["compiled_gate_up_silu"] = compiles(lambda t: mlp_triton.gate_up_silu(t, w), x)
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.silu_mul_probe", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "tokens": TOKENS,
              "shapes": {name: probe(*shape) for name, shape in SHAPES.items()}}
    (Path(args.out) / "silu-mul.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
