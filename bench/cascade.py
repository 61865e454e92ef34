"""Cascades against the exact query: rows the model answers, wall time, realized recall and precision.

    python -m bench.cascade --scale 0.1 --model dummy:qwen3-4b --tokenizer DIR --device cuda --precision bf16 \\
        --sol-device h100 --out bench/results

- Corpus: the benchmark's reviews (bench/datagen.py) at `--scale` (5,000 rows at 0.1), a tenth as long by
  default (`--length-scale 0.1`, about 30 tokens): at full length a review names most of the vocabulary's
  subjects, and the rule below would answer yes to nearly every one (98% for two subjects).
- Answers are not a model's (random weights answer nothing): the learnable query is answered by
  `--decisions rule` (yes where a review holds a word of four letters or more of the question, here
  "about" or "terrace": 16% of the short reviews), which an embedding can learn; the unlearnable one by `hash` at
  selectivity 0.2 (the prompt's content hash: nothing to learn). The forward passes run in full in both.
- Each query runs exact, then as a cascade ({'recall': 0.9, 'confidence': 0.95} by default), the KV pool
  cleared before each run, twice each (the figures are the second runs'). Recall and precision are
  measured against the exact query's rows.
- Goals (the issue's): on the learnable query at most 25% of the rows reach the model and the cascade is
  >= 3x faster than the exact query; on the unlearnable one it is at most 10% slower.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

import quail

from .datagen import Workload, reviews
from .provenance import device_name, git_commit
from .run import short_device, versions, warm_up, write_json

QUERIES = {  # name: (decisions, question)
    "learnable": ("rule", "Is {0} about the terrace?"),
    "unlearnable": ("hash", "Is {0} written by a regular guest?"),
}


def _timed(session: quail.Session, sql: str) -> tuple[set[int], quail.Report]:
    """The ids a query returns and its report; the KV pool and the runtime's memo cleared first (each run
    computes its own: a cascade would otherwise reuse the last one's answers and proxy)."""
    session.runtime.runner.tree.clear()
    session.runtime.memo.clear()
    result = session.sql(sql).run()
    return set(result.table.column("id").to_pylist()), result.report


def measure(session: quail.Session, question: str, options: str, rows: int, repeats: int) -> dict[str, Any]:
    """The exact query and the cascade, `repeats` times each (the last run's figures), and their rows compared."""
    exact_sql = f"SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{question}', body))"
    cascade_sql = f"SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{question}', body), {options})"
    for _ in range(repeats):
        exact, exact_report = _timed(session, exact_sql)
        kept, report = _timed(session, cascade_sql)
    right = len(kept & exact)
    (stage,) = [s for s in report.stages if s["operator"] == "ai_cascade"]
    out = {"rows": rows, "exact_rows": len(exact), "cascade_rows": len(kept),
           "exact_wall_s": exact_report.wall_s, "cascade_wall_s": report.wall_s,
           "speedup": exact_report.wall_s / report.wall_s, "model_rows": report.requests,
           "model_share": report.requests / rows, "exact_model_rows": exact_report.requests,
           "recall": right / len(exact) if exact else 1.0, "precision": right / len(kept) if kept else 1.0,
           "cascade": {k: v for k, v in stage.items() if k not in ("operator", "output")},
           "exact_sol_s": exact_report.sol_s, "cascade_sol_s": report.sol_s}
    print(f"{question!r}: exact {exact_report.wall_s:.2f}s, cascade {report.wall_s:.2f}s "
          f"({out['speedup']:.2f}x), model rows {report.requests}/{rows}, recall {out['recall']:.3f}, "
          f"precision {out['precision']:.3f}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(prog="python -m bench.cascade", description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--length-scale", type=float, default=0.1)
    p.add_argument("--model", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto")
    p.add_argument("--sol-device", default=None)
    p.add_argument("--options", default="{'recall': 0.9, 'confidence': 0.95}")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    table = reviews(Workload(args.scale, 0, args.length_scale))["reviews"]
    config = quail.EngineConfig(model=args.model, tokenizer=args.tokenizer, device=args.device,
                                precision=args.precision, sol_device=args.sol_device, decisions="rule")
    base = quail.Session(config).runtime
    results = {}
    for name, (decisions, question) in QUERIES.items():
        runtime = base if decisions == base.decisions else base.variant("quail", decisions=decisions)
        warm_up(runtime)
        session = quail.Session(config, runtime=runtime)
        session.register("reviews", table)
        results[name] = {"decisions": decisions, "question": question,
                         **measure(session, question, args.options, table.num_rows, args.repeats)}
    device = device_name(str(base.runner.device))
    doc = {"benchmark": "cascade", "date": dt.date.today().isoformat(), "git_commit": git_commit(),
           "device": device, "model": base.model_id, "precision": args.precision, "scale": args.scale,
           "length_scale": args.length_scale, "options": args.options, "versions": versions(),
           "answers": "not the model's: --decisions rule (learnable) and hash (unlearnable)", "queries": results}
    name = f"{dt.date.today().isoformat()}-{short_device(device)}-cascade-{git_commit()[:7]}.json"
    return write_json(Path(args.out) / name, doc)


if __name__ == "__main__":
    main()
