"""GPU probe: why F1's passes take ~230 ms in the benchmark and ~202 ms in `profile_pass` (H200).

Runs F1-like passes (rows of lognormal lengths around 330 tokens, up to 16,384
tokens, bf16, compiled, flash varlen) back to back for --seconds each way:
- `same`: one composition again and again (as profile_pass times it);
- `new`: a new composition every pass (as a query brings them);
and records each pass's milliseconds (CUDA events), with the SM clock and the
power draw sampled every few passes: whether sustained load slows the GPU
(clocks falling with power at its cap) or new shapes cost time on the GPU.
Writes sustained.json to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from quail.engine.model.config import EngineConfig
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.loading import load_runtime
from quail.engine.runtime.packing import Row


def composition(rng: np.random.Generator, budget: int = 16384) -> list[Row]:
    lengths = np.maximum(8, rng.lognormal(np.log(330) - 0.08, 0.4, 100).astype(int))
    lengths = lengths[np.cumsum(lengths) <= budget]
    return [Row(rng.integers(0, 1000, n).astype(np.int32)) for n in lengths]


def sample() -> dict:
    return {"sm_clock_mhz": torch.cuda.clock_rate(), "power_w": torch.cuda.power_draw() / 1000,
            "temperature_c": torch.cuda.temperature()}


def series(runtime, passes: list[list[Row]], seconds: float) -> dict:
    """Per-pass milliseconds and tokens over `seconds` of back-to-back passes, with GPU samples."""
    runner, out, samples = runtime.runner, [], []
    spent, i = 0.0, 0
    while spent < seconds * 1000:
        rows = passes[i % len(passes)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runner.forward(rows, Stats())
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end)
        out.append({"ms": ms, "tokens": sum(len(r.ids) for r in rows)})
        if i % 5 == 0:
            samples.append({"pass": i, **sample()})
        spent += ms
        i += 1
    per_token = [p["ms"] / p["tokens"] * 16000 for p in out]
    return {"passes": out, "samples": samples, "ms_per_16k_first5": float(np.mean(per_token[:5])),
            "ms_per_16k_last20": float(np.mean(per_token[-20:])), "ms_per_16k_median": float(np.median(per_token))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="dummy:qwen3-4b")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--seconds", type=float, default=25)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    runtime = load_runtime(EngineConfig(model=args.model, device="cuda", precision="bf16", tokenizer=args.tokenizer,
                                        compile=True, attention="varlen"))
    runtime.warm_up()
    rng = np.random.default_rng(0)
    result = {"device": torch.cuda.get_device_name(0), "idle": sample()}
    result["same"] = series(runtime, [composition(rng)], args.seconds)
    result["new"] = series(runtime, [composition(rng) for _ in range(200)], args.seconds)
    for name in ("same", "new"):
        print(name, {k: v for k, v in result[name].items() if k.startswith("ms")}, result[name]["samples"][-1],
              flush=True)
    Path(args.out, "sustained.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
