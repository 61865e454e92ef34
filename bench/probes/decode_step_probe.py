"""GPU probe: a decode step's parts on the H200: the paged decode kernel, and a captured step against the general pass.

1. Kernel (`kernel`): engine/kernels/paged_decode_triton.py on Qwen3-4B
   attention shapes (32/8 heads, d=128, bf16), `sequences` of `keys` keys
   each, their slots scattered at random over a pool of 262,144: its largest
   difference from the reference (paged_decode.gathered), milliseconds a layer
   for several launch settings, and the bandwidth that is (keys and values
   read once).
2. Step (`step`): a runtime of dummy weights; per batch size, that many
   prompts of `--prompt` tokens prefilled into the pool, then one decode step
   of the same tokens two ways: a captured graph (ModelRunner._step, rows with
   slot tables) and the general pass (rows after their runs). The largest
   relative difference of the hidden states and the milliseconds of each
   (host work included, the device's queue drained after each).
Writes decode-step.json to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import quail
from bench.probes.engine_args import add_engine_arguments, engine_config
from quail.engine.kernels import paged_decode_triton
from quail.engine.kernels.paged_decode import gathered
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.packing import Row

from .timing import timed_ms

H, HKV, D, POOL = 32, 8, 128, 1 << 18
KERNEL_SHAPES = ((64, 192), (256, 192), (1024, 192), (256, 1024), (64, 4096))  # (sequences, keys each)
LAUNCH = ((64, 4, 2), (64, 4, 3), (32, 4, 3), (128, 4, 3), (128, 8, 3))  # (keys a step, warps, stages)


def kernel(rng: np.random.Generator) -> dict:
    keys = torch.randn(POOL, HKV, D, device="cuda", dtype=torch.bfloat16)
    values = torch.randn(POOL, HKV, D, device="cuda", dtype=torch.bfloat16)
    out = {}
    for sequences, length in KERNEL_SHAPES:
        table = torch.from_numpy(rng.choice(POOL, size=(sequences, length), replace=False).astype(np.int32)).cuda()
        lengths = torch.from_numpy(rng.integers(length // 2, length + 1, sequences)).cuda()
        q = torch.randn(sequences, H, D, device="cuda", dtype=torch.bfloat16)
        reference = gathered(q, keys, values, table, lengths)[0].float()
        read = 2 * int(lengths.sum()) * HKV * D * 2
        shape = {}
        for block_n, warps, stages in LAUNCH:
            def call():
                return paged_decode_triton.paged_decode(q, keys, values, table, lengths, block_n=block_n,
                                                        num_warps=warps, num_stages=stages)
            diff = (call().float() - reference).abs().max().item()
            ms = timed_ms(call)
            shape[f"n{block_n}_w{warps}_s{stages}"] = {"ms": round(ms, 4), "max_diff": round(diff, 5),
                                                       "tb_per_s": round(read / ms / 1e9, 3)}
        out[f"{sequences}x{length}"] = shape
        print(sequences, length, shape, flush=True)
    return out


def step(args: argparse.Namespace, rng: np.random.Generator) -> dict:
    runtime = quail.Session(engine_config(args)).runtime
    runtime.warm_up()
    runner = runtime.runner
    out = {}
    for batch in map(int, args.batches.split(",")):
        prompts = [rng.integers(100, 20000, args.prompt).astype(np.int64) for _ in range(batch)]
        _, runs = runner.forward([Row(p, keep=args.prompt) for p in prompts], Stats())
        tokens = [np.array([t], dtype=np.int64) for t in rng.integers(100, 20000, batch)]
        assert all(len(r.parts) == 1 and r.parts[0][0] is runner.pool for r in runs)
        stepped = [Row(t, keep=1, slots=r.parts[0][1]) for t, r in zip(tokens, runs)]
        general = [Row(t, run, keep=1) for t, run in zip(tokens, runs)]
        with torch.inference_mode():
            a = runner.forward(stepped, Stats())[0].float()
            b = runner.forward(general, Stats())[0].float()
        diff = ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()
        timings = {name: timed_ms(lambda rows=rows: (runner.forward(rows, Stats()), torch.cuda.synchronize()), 10)
                   for name, rows in (("graph", stepped), ("general", general))}
        out[batch] = {"max_relative_diff": round(diff, 5), **{f"{k}_ms": round(v, 3) for k, v in timings.items()}}
        print(batch, out[batch], flush=True)
        del runs, stepped, general
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--batches", default="64,256,1024")
    p.add_argument("--prompt", type=int, default=160)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    result = {"model": args.model, "precision": args.precision, "prompt_tokens": args.prompt,
              "kernel": kernel(rng), "step": step(args, rng)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode-step.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
