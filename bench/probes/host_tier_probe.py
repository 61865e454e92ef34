"""GPU probe: documents the KV pool has no room for, copied back from the host tier or computed again.

Through the public Python API, dummy weights, hash decisions. One table of
`rows` reviews of ~300 tokens, more than the pool (`--kv-cache-bytes`) holds;
three statements over all of it, each an AI_FILTER projected as a column (so
the plan demotes no document): `first` (cold: every document computed), `other`
(a new question over the same documents) and `again` (the first sent again).
Run twice over the same weights: with a host tier of `--kv-host-bytes`
(documents come back by copy) and without (they are computed again). Writes
host_tier.json to --out: per run and statement the wall seconds, fresh tokens
and the tokens copied back, and what the warm-up timed and chose (a pass's
worth of prompts copied back against computed): the runs say whether it chose
right at this pool size.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import quail
from bench.datagen import numbered_reviews
from bench.probes.engine_args import add_engine_arguments, engine_config
from quail.engine.runtime.runtime import Runtime

QUESTIONS = {"first": "Does the review {0} complain about the service?",
             "other": "Does the review {0} mention the price?"}


def statement(question: str) -> str:
    return f"SELECT id, AI_FILTER(PROMPT('{question}', body)) AS answer FROM reviews"


def run(session: quail.Session) -> dict:
    tree = session.runtime.runner.tree
    out = {}
    for name, question in (("first", QUESTIONS["first"]), ("other", QUESTIONS["other"]),
                           ("again", QUESTIONS["first"])):
        restored = tree.counts.restored
        started = time.perf_counter()
        report = session.sql(statement(question)).run().report
        out[name] = {"wall_s": round(time.perf_counter() - started, 3), "fresh_tokens": report.fresh_tokens,
                     "logical_tokens": report.logical_tokens, "restored_tokens": tree.counts.restored - restored}
    out["offloaded_tokens"] = tree.counts.offloaded
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--rows", type=int, default=600)
    p.add_argument("--kv-cache-bytes", type=int, default=4 << 30)
    p.add_argument("--kv-host-bytes", type=int, default=40 << 30)
    p.add_argument("--out", default=".")
    p.add_argument("--runs", choices=("both", "with", "without"), default="both",
                   help="one run alone (a pool the GPU holds only once: one run a process)")
    args = p.parse_args()
    table = numbered_reviews(args.rows, 300)
    result: dict = {"rows": args.rows, "kv_cache_bytes": args.kv_cache_bytes, "kv_host_bytes": args.kv_host_bytes}
    base = None
    if args.runs != "without":
        with_host = quail.Session(engine_config(args, kv_cache_bytes=args.kv_cache_bytes,
                                                kv_host_bytes=args.kv_host_bytes))
        with_host.register("reviews", table)
        with_host.runtime.warm_up()
        host = with_host.runtime.runner.tree.host
        result.update({"bytes_per_token": host.bytes_per_token, "warm_up_restore_s": host.restore_s,
                       "warm_up_recompute_s": host.recompute_s, "restores": host.restores})
        host.restore_s = None  # copied back whatever the warm-up chose: the choice is what this probe checks
        result["with_host_tier"] = run(with_host)
        base = with_host.runtime
    if args.runs != "with":
        if base is None:
            session = quail.Session(engine_config(args, kv_cache_bytes=args.kv_cache_bytes))
        else:
            session = quail.Session(runtime=Runtime(base.model_id, base.runner.model, base.tokenizer,
                                                    base.layout.frame, "quail", args.token_budget, "hash",
                                                    kv_bytes=args.kv_cache_bytes))
        session.register("reviews", table)
        result["without"] = run(session)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "host_tier.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
