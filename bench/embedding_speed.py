"""Embeddings per second of a decoder embedding model (`--embed-model`) against the prefill speed of light.

    python -m bench.embedding_speed --model dummy:qwen3-embedding-0.6b --device cuda --precision bf16 \
        --tokenizer DIR [--texts 20000] [--words 120] [--out DIR]

- The texts are distinct generated sentences of about `--words` words; they are embedded in one call, as
  one statement's AI_EMBED over a column would ask (Embeddings.embed: each distinct text once, passes of the
  token budget, no KV kept), after a warm-up call of other texts.
- The speed of light is planner/cost.py's roofline of the same work (every token's prefill, its attention)
  on the device's datasheet rates (`--sol-device`: h100-sxm or h200; cpu on the CPU).
- Beside the wall time: the device's busy seconds (each pass from its first kernel's start to its last's end,
  DeviceTime: the rest of the wall the device waited between passes).
The result file (`<date>-<device>-embedding-speed-<shape>.json`) holds the figures and the setup.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
from pathlib import Path

import torch

from quail.engine.model.config import EngineConfig
from quail.engine.runtime.loading import load_embeddings
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, Segment
from quail.planner.cost import DEVICES, sol_seconds

from .provenance import git_commit
from .run import write_json

WORDS = ("soup pasta waiter bill terrace bread dessert wine table kitchen service price menu night friend order "
         "cold warm slow quick rude kind great poor fresh stale sweet salty loud quiet").split()


def texts(count: int, words: int, seed: int, numbered: bool = True) -> list[str]:
    """Sentences of `words` words drawn from WORDS; `numbered`: each begins with its number (all distinct)."""
    rng = random.Random(seed)
    return [(f"{k}: " if numbered else "") + " ".join(rng.choice(WORDS) for _ in range(words)) for k in range(count)]


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.embedding_speed", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="dummy:qwen3-embedding-0.6b")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--tokenizer", default=None, help="an HF tokenizer directory (default: the embedded model's)")
    p.add_argument("--token-budget", type=int, default=None)
    p.add_argument("--texts", type=int, default=2000)
    p.add_argument("--words", type=int, default=120)
    p.add_argument("--sol-device", default=None, help="h100-sxm, h200 or cpu (default: cpu on the CPU)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    config = EngineConfig(model=args.model, embed_model=args.model, device=args.device, precision=args.precision,
                          tokenizer=args.tokenizer, token_budget=args.token_budget)
    started = time.perf_counter()
    embeddings = load_embeddings(config)
    model = embeddings.model()
    runtime = model.runtime
    load_s = time.perf_counter() - started
    embeddings.embed(texts(min(64, args.texts), args.words, seed=1))  # warm-up: the passes' shapes and kernels
    rows = model.tokens(texts(args.texts, args.words, seed=0))
    requests = [Request((Segment.of(ids, model.name),), runtime.yes_no) for ids in rows]
    work = QueryWork()
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    busy = runtime.scheduler.busy.seconds()
    started = time.perf_counter()
    hidden = runtime.hidden(requests, work)
    torch.nn.functional.normalize(torch.stack(hidden).float(), dim=-1).cpu()
    seconds = time.perf_counter() - started
    busy = runtime.scheduler.busy.seconds() - busy
    sol_device = args.sol_device or ("cpu" if args.device == "cpu" else None)
    sol = (sol_seconds(work.stats, runtime.config, DEVICES[sol_device], args.precision, runtime.runner.token_budget)
           if sol_device else None)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    tokens = sum(len(r) for r in requests)
    doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_commit": git_commit(),
           "command": "python -m bench.embedding_speed " + " ".join(argv), "device": name, "model": args.model,
           "precision": args.precision, "token_budget": runtime.runner.token_budget, "dims": embeddings.dims,
           "load_s": round(load_s, 2), "texts": len(requests), "tokens": tokens,
           "seconds": round(seconds, 3), "device_busy_s": round(busy, 3),
           "embeddings_per_s": round(len(requests) / seconds),
           "tokens_per_s": round(tokens / seconds), "forward_passes": work.stats.forward_passes,
           "sol_device": sol_device, "sol_s": round(sol, 4) if sol else None,
           "sol_fraction": round(sol / seconds, 3) if sol else None}
    print(json.dumps(doc, indent=1))
    shape = args.model.split(":")[-1].replace("/", "-")
    return write_json(Path(args.out) / f"{doc['date'][:10]}-{'cpu' if name == 'cpu' else 'gpu'}-embedding-speed-"
                      f"{shape}.json", doc)


if __name__ == "__main__":
    main()
