"""Semantic top-k and a similarity join in SQL, timed against the same arithmetic done at once in numpy.

    python -m bench.embedding_queries [--rows 100000] [--left 10000] [--right 10000] [--out DIR]

- Top-k: `SELECT id FROM docs ORDER BY AI_SIMILARITY(body, 'q') DESC, id LIMIT 10` over `--rows` generated
  texts, cold (every text embedded) and warm (kept from the cold run), in process (quail.Session, the
  embedded static model); the floor is the arithmetic alone in numpy, over embeddings at hand: the
  matrix-vector product and the top k.
- Join: `SELECT l.id, r.id FROM l JOIN r ON AI_SIMILARITY(l.body, r.body) > 0.8` over `--left` by `--right`
  rows, warm; the floor is one matrix product of the two sides' embeddings in numpy (embeddings at hand).
Both results are checked against numpy's. The result file (`<date>-cpu-embedding-queries.json`) holds the
figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import quail

from .embedding_speed import texts
from .run import git_commit, write_json

THRESHOLD = 0.8


def timed(session: quail.Session, sql: str) -> tuple[float, pa.Table]:
    started = time.perf_counter()
    table = session.sql(sql, dialect="duckdb").run().table
    return time.perf_counter() - started, table


def embedded(session: quail.Session, values: list[str]) -> np.ndarray:
    return np.array(session.runtime.embeddings.embed(values), dtype=np.float64)


def cosines(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Every pair's cosine, in float64 (as AI_SIMILARITY computes it)."""
    return (first @ second.T) / np.outer(np.linalg.norm(first, axis=1), np.linalg.norm(second, axis=1))


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.embedding_queries", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--left", type=int, default=10_000)
    p.add_argument("--right", type=int, default=10_000)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    session = quail.Session()
    docs = texts(args.rows, 12, seed=0, numbered=False)
    left, right = texts(args.left, 8, seed=1, numbered=False), texts(args.right, 4, seed=2, numbered=False)
    session.register("docs", pa.table({"id": list(range(len(docs))), "body": docs}))
    session.register("l", pa.table({"id": list(range(len(left))), "body": left}))
    session.register("r", pa.table({"id": list(range(len(right))), "body": right}))
    session.sql("SELECT AI_EMBED('load the model') AS e").run()
    top = "SELECT id FROM docs ORDER BY AI_SIMILARITY(body, 'cold soup and a rude waiter') DESC, id LIMIT 10"
    cold_s, got = timed(session, top)
    warm_s, _ = timed(session, top)
    vectors, query = embedded(session, docs), embedded(session, ["cold soup and a rude waiter"])[0]
    started = time.perf_counter()
    scores = cosines(vectors, query[None])[:, 0]
    best = sorted(np.argpartition(-scores, 20)[:20], key=lambda k: (-round(float(scores[k]), 9), k))[:10]
    floor_s = time.perf_counter() - started
    join = f"SELECT l.id AS a, r.id AS b FROM l JOIN r ON AI_SIMILARITY(l.body, r.body) > {THRESHOLD}"
    timed(session, join)
    join_s, pairs = timed(session, join)
    sides = embedded(session, left), embedded(session, right)
    started = time.perf_counter()
    matrix = cosines(*sides)
    want = sorted(zip(*np.nonzero(matrix > THRESHOLD)))
    gemm_s = time.perf_counter() - started
    doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_commit": git_commit(),
           "command": "python -m bench.embedding_queries " + " ".join(argv), "device": "cpu", "cpus": os.cpu_count(),
           "model": session.runtime.embeddings.name,
           "top_k": {"rows": len(docs), "k": 10, "cold_s": round(cold_s, 3), "warm_s": round(warm_s, 3),
                     "numpy_floor_s": round(floor_s, 4),
                     "agree": got.column("id").to_pylist() == [int(k) for k in best]},
           "join": {"left": len(left), "right": len(right), "pairs_compared": len(left) * len(right),
                    "pairs_found": pairs.num_rows, "warm_s": round(join_s, 3), "numpy_floor_s": round(gemm_s, 4),
                    "agree": sorted(zip(pairs.column("a").to_pylist(), pairs.column("b").to_pylist())) ==
                    [(int(a), int(b)) for a, b in want]}}
    print(json.dumps(doc, indent=1))
    return write_json(Path(args.out) / f"{doc['date'][:10]}-cpu-embedding-queries.json", doc)


if __name__ == "__main__":
    main()
