"""GPU probe: completions decoding while a prefill scan runs on the same device, each alone and both at once.

A runtime of dummy weights; completions: `--sequences` prompts of
`--prompt` tokens, `--tokens` generated each (greedy, no stop); a scan:
`--scan` requests of `--scan-tokens` tokens each, answered yes / no. Each
is timed alone, then both are started together from two threads (two
queries on the one scheduler, as two clients would be): each one's seconds,
forward passes and, for the completions, decode steps. Neither starves when
each finishes well before the two alone would, one after the other. Writes
mixed.json to --out.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
import torch

import quail
from bench.probes.engine_args import add_engine_arguments, engine_config
from quail.engine.runtime.decode import Decoding
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, Segment


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--sequences", type=int, default=256)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--scan", type=int, default=2000)
    p.add_argument("--scan-tokens", type=int, default=300)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    runtime = quail.Session(engine_config(args)).runtime
    runtime.warm_up()
    rng = np.random.default_rng(0)

    def requests(n: int, length: int) -> list[Request]:
        return [Request((Segment.of(rng.integers(100, 20000, length), runtime.model_id),), runtime.yes_no)
                for _ in range(n)]

    prompts, scan = requests(args.sequences, args.prompt), requests(args.scan, args.scan_tokens)
    jobs = {"completions": lambda work: runtime.generate(prompts, Decoding(args.tokens), work=work),
            "scan": lambda work: runtime.score(scan, work)}
    result = {"model": args.model, "precision": args.precision, **{k: v for k, v in vars(args).items()
                                                                   if k not in ("model", "precision", "out")}}

    def run(names: list[str]) -> dict:
        runtime.runner.tree.clear()
        torch.cuda.synchronize()
        began, out = time.perf_counter(), {}

        def one(name: str) -> None:
            work = QueryWork()
            jobs[name](work)
            torch.cuda.synchronize()
            out[name] = {"s": round(time.perf_counter() - began, 3), "forward_passes": work.stats.forward_passes,
                         "decode_steps": work.stats.decode_steps, "fresh_tokens": work.stats.fresh_tokens}

        threads = [threading.Thread(target=one, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return out

    result["alone"] = {name: run([name])[name] for name in jobs}
    result["together"] = run(list(jobs))
    print(json.dumps(result, indent=1), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "mixed.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
