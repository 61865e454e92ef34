"""GPU probe: two runtime replicas against one, through the public Python API, over the same table.

One table of `rows` reviews of ~300 tokens; a session with one runtime and then
one with `--replicas` (the second and later in processes of their own, on the
next GPUs, or sharing the GPU where there is only one) run the same statements:
an AI_SCORE column (its scores compared) and an AI_FILTER (its rows compared),
each twice (the second time the documents are resident where they were routed).
Decisions come from the model, so the scores say whether the replicas computed
what one runtime computes. Writes replicas.json to --out: per session and
statement the wall seconds and fresh tokens, the largest score difference and
whether the filter's rows agree, and the GPUs present (on one GPU the replicas
share it: the timings say nothing of scaling).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

import quail
from bench.datagen import numbered_reviews
from bench.probes.engine_args import add_engine_arguments

SCORE = "SELECT id, AI_SCORE(PROMPT('How angry is the writer of {0}?', body)) AS s FROM reviews ORDER BY id"
FILTER = "SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Does {0} mention the price?', body)) ORDER BY id"


def run(config: quail.EngineConfig, table) -> dict:
    session = quail.Session(config)
    try:
        session.register("reviews", quail.DocumentProvider.from_table(table, id_col="id"))
        out = {}
        for name, query in (("score", SCORE), ("score_again", SCORE), ("filter", FILTER)):
            started = time.perf_counter()
            result = session.sql(query).run()
            out[name] = {"wall_s": round(time.perf_counter() - started, 3), "fresh_tokens": result.report.fresh_tokens,
                         "rows": result.collect().to_pydict()}
        return out
    finally:
        session.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--kv-cache-bytes", type=int, default=8 << 30, help="each replica's pool")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    table = numbered_reviews(args.rows, 300)
    config = quail.EngineConfig(model=args.model, device=args.device, precision=args.precision,
                                token_budget=args.token_budget, tokenizer=args.tokenizer,
                                kv_cache_bytes=args.kv_cache_bytes)
    one = run(config, table)
    many = run(replace(config, replicas=args.replicas), table)
    scores = [(a, b) for a, b in zip(one["score"]["rows"]["s"], many["score"]["rows"]["s"])]
    result = {"model": args.model, "precision": args.precision, "rows": args.rows, "replicas": args.replicas,
              "gpus": torch.cuda.device_count(), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "max_score_difference": max(abs(a - b) for a, b in scores),
              "filter_rows_agree": one["filter"]["rows"] == many["filter"]["rows"],
              "same_ids": one["score"]["rows"]["id"] == many["score"]["rows"]["id"],
              "one": {k: {m: v for m, v in s.items() if m != "rows"} for k, s in one.items()},
              "many": {k: {m: v for m, v in s.items() if m != "rows"} for k, s in many.items()}}
    text = json.dumps(result, indent=1)
    print(text)
    Path(args.out, "replicas.json").write_text(text)


if __name__ == "__main__":
    main()
