"""GPU probe: launch settings (columns per step, warps, pipeline stages) of the fp8 quantization kernel
(engine/kernels/fp8_triton.py) on an F1-sized pass of Qwen3-4B: SiLU·mul + quantization of 16K × 9,728 and the
quantization of 16K × 4,096, each setting's milliseconds, GB/s of compulsory traffic, and whether its
output equals the shipped settings' bit for bit. Writes quantize-launch.json to --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from quail.engine.kernels import fp8_triton as fp8_kernels

from .timing import timed_ms

TOKENS, HEADS_DIM, INTER = 16384, 4096, 9728


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    torch.manual_seed(0)
    gate, up = (torch.randn(TOKENS, INTER, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    attn = torch.randn(TOKENS, HEADS_DIM, device="cuda", dtype=torch.bfloat16)
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "tokens": TOKENS,
                    "shipped": {"block": fp8_kernels.BLOCK, "warps": {"silu_mul": 8, "quantize": 4}}}
    cases = {"silu_mul": (up, gate, 5 * TOKENS * INTER), "quantize": (attn, None, 3 * TOKENS * HEADS_DIM)}
    for name, (x, g, traffic) in cases.items():
        want = fp8_kernels.silu_mul_rows(g, x) if g is not None else fp8_kernels.quantize_rows(x)
        rows = []
        for block, warps, stages in itertools.product((512, 1024, 2048, 4096), (2, 4, 8, 16), (1, 2, 3, 4)):
            if block // (32 * warps) < 2:
                continue
            got = fp8_kernels._launch(x, g, block, num_warps=warps, num_stages=stages)
            ms = timed_ms(lambda: fp8_kernels._launch(x, g, block, num_warps=warps, num_stages=stages))
            rows.append({"block": block, "warps": warps, "stages": stages, "ms": ms, "gb_per_s": traffic / ms / 1e6,
                         "equal": bool(torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
                                       and torch.equal(got[1], want[1]))})
        rows.sort(key=lambda r: r["ms"])
        result[name] = rows
        print(name, json.dumps(rows[:5]), flush=True)
    Path(args.out, "quantize-launch.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
