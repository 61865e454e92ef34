"""GPU probe: Qwen3's q/k norms and rotation after the joined q/k/v GEMM, by Inductor and by rope_triton.

    python -m bench.probes.rope_probe --out DIR

On one 16,280-token pass of the Qwen3-Embedding-0.6B (16 q heads, 8 k heads) and Qwen3-4B (32, 8) shapes
(bf16, head 128): Inductor's fused norms and rope (compiled for any token count: the runner's way before
rope_triton) and rope_triton.norm_rope per tokens a program and warps, each with its bandwidth (the q and k
heads read and written, the rotary tables read) and its relative error against fp32; and whether the kernel
runs inside `torch.compile(dynamic=True)` at two token counts. Writes rope.json to --out.
"""

from __future__ import annotations

import json

import torch

from quail.engine.kernels import rope_triton
from quail.engine.model.decoder import RMSNorm, apply_rope, rope_tables

from .silu_mul_probe import compiles, error
from .timing import shapes_probe, sweep, timed_ms

TOKENS = 16280
SHAPES = {"qwen3-embedding-0.6b": (16, 8), "qwen3-4b": (32, 8)}
HEAD = 128
BLOCKS = [(16, 4), (8, 2), (8, 4), (32, 4), (32, 8), (64, 8), (4, 1)]  # tokens a program, warps


def probe(heads: int, kv_heads: int) -> dict:
    torch.manual_seed(0)
    t, d = TOKENS, HEAD
    joined = torch.randn(t, (heads + 2 * kv_heads) * d, device="cuda", dtype=torch.bfloat16)
    q_norm, k_norm = RMSNorm(d, 1e-6).cuda().bfloat16(), RMSNorm(d, 1e-6).cuda().bfloat16()
    for norm in (q_norm, k_norm):
        norm.weight.data = 1 + 0.1 * torch.randn_like(norm.weight)
    cos, sin = (x.to(torch.bfloat16) for x in rope_tables(torch.randint(0, 30000, (t,), device="cuda"), d, 1e6))

    def torch_way(j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = j.shape[0]
        q, k = j[:, :heads * d].view(n, heads, d), j[:, heads * d:(heads + kv_heads) * d].view(n, kv_heads, d)
        c, s = cos[:n], sin[:n]
        return apply_rope(q_norm(q), c, s), apply_rope(k_norm(k), c, s)

    def ours(j: torch.Tensor, rows: int = rope_triton.ROWS, **settings: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = j.shape[0]
        return rope_triton.norm_rope(j, heads, kv_heads, q_norm.weight, k_norm.weight, 1e-6, cos[:n], sin[:n],
                                     rows=rows, **settings)

    for norm in (q_norm, k_norm):
        norm.float()
    with torch.no_grad():
        want = torch_way(joined.float())  # the reference: fp32 throughout (the tables as the model has them)
    for norm in (q_norm, k_norm):
        norm.bfloat16()
    inductor = torch.compile(torch_way, dynamic=True)
    moved = t * (heads + kv_heads) * d * 2 * 2 + 2 * t * d * 2  # bytes: q and k read and written, the tables read

    def errors(pair: tuple[torch.Tensor, torch.Tensor]) -> float:
        return max(error(got, w) for got, w in zip(pair, want))

    out: dict = {"inductor_ms": timed_ms(lambda: inductor(joined)), "inductor_error": errors(inductor(joined))}
    out["inductor_tb_per_s"] = moved / out["inductor_ms"] / 1e9
    out["norm_rope"] = sweep("rows", BLOCKS, lambda rows, warps: ours(joined, rows, num_warps=warps), moved, errors)
    out["compiled"] = compiles(lambda j: torch.cat([x.flatten(1) for x in ours(j)], dim=1), joined)
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    shapes_probe("python -m bench.probes.rope_probe", __doc__.split("\n")[0], TOKENS, "rope.json",
                 {name: lambda shape=shape: probe(*shape) for name, shape in SHAPES.items()}, argv)


if __name__ == "__main__":
    main()
