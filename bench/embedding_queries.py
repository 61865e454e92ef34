"""Semantic top-k, a similarity join and top-k per row in SQL, timed against the same arithmetic done at once.

    python -m bench.embedding_queries [--rows 100000] [--left 10000] [--right 10000] [--out DIR]
    python -m bench.embedding_queries --embed-model dummy:qwen3-embedding-0.6b --device cuda --precision bf16 \\
        --tokenizer DIR

- Top-k: `SELECT id FROM docs ORDER BY AI_SIMILARITY(body, 'q') DESC, id LIMIT 10` over `--rows` generated
  texts, cold (every text embedded) and warm (kept from the cold run); the floor is the arithmetic alone
  over embeddings at hand: the matrix-vector product and the top k.
- Join: `SELECT l.id, r.id FROM l JOIN r ON AI_SIMILARITY(l.body, r.body) > t` over `--left` by `--right`
  rows, warm (t: the 99.9th percentile of the pairs' cosines, so about 0.1% of pairs pass).
- Top k per row: `... FROM l, r QUALIFY ROW_NUMBER() OVER (PARTITION BY l.id ORDER BY AI_SIMILARITY(l.body,
  r.body) DESC, r.id) <= 5`, warm.
- The floor of both: one matrix product of the two sides' embeddings (float32, on the device).
- In process (quail.Session): the embedded static model on the CPU by default, or `--embed-model` on
  `--device`. Every result is checked against numpy's; the file
  (`<date>-<cpu|gpu>-embedding-queries-<model>-<git short sha>.json`) holds the figures.
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
import torch

import quail
from quail.engine.model.config import EngineConfig

from .embedding_speed import texts
from .provenance import git_commit
from .run import write_json

K_PER_ROW = 5
QUESTION = "cold soup and a rude waiter"
QUERY = f"SELECT id FROM docs ORDER BY AI_SIMILARITY(body, '{QUESTION}') DESC, id LIMIT 10"


def timed(session: quail.Session, sql: str) -> tuple[float, pa.Table]:
    started = time.perf_counter()
    table = session.sql(sql, dialect="duckdb").run().table
    return time.perf_counter() - started, table


def said(phase: str, started: float) -> None:
    """A phase's end on stderr, seconds since the run began: where a run that is stopped short got to."""
    print(f"{time.perf_counter() - started:8.1f} s  {phase}", file=sys.stderr, flush=True)


def embedded(session: quail.Session, values: list[str]) -> np.ndarray:
    return np.array(session.runtime.embeddings.embed(values), dtype=np.float64)


def cosines(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Every pair's cosine, in float64 (as AI_SIMILARITY computes it)."""
    return (first @ second.T) / np.outer(np.linalg.norm(first, axis=1), np.linalg.norm(second, axis=1))


def matrix_floor(first: np.ndarray, second: np.ndarray, device: str) -> float:
    """Seconds of one float32 product of the two sides' embeddings on the device (the second of two runs)."""
    a, b = (torch.from_numpy(side.astype(np.float32)).to(device) for side in (first, second))
    for _ in range(2):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        (a @ b.T).max()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    return seconds


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.embedding_queries", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--left", type=int, default=10_000)
    p.add_argument("--right", type=int, default=10_000)
    p.add_argument("--embed-model", default=None, help="default: the embedded static model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--tokenizer", default=None, help="an HF tokenizer directory (dummy weights)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    config = EngineConfig(model=args.embed_model, embed_model=args.embed_model, device=args.device,
                          precision=args.precision, tokenizer=args.tokenizer) if args.embed_model else EngineConfig()
    began = time.perf_counter()
    session = quail.Session(config)
    said("model loaded", began)
    docs = texts(args.rows, 12, seed=0, numbered=False)
    left, right = texts(args.left, 8, seed=1, numbered=False), texts(args.right, 4, seed=2, numbered=False)
    session.register("docs", pa.table({"id": list(range(len(docs))), "body": docs}))
    session.register("l", pa.table({"id": list(range(len(left))), "body": left}))
    session.register("r", pa.table({"id": list(range(len(right))), "body": right}))
    session.sql("SELECT AI_EMBED('load the model') AS e").run()
    cold_s, got = timed(session, QUERY)
    said(f"top-k cold ({cold_s:.1f} s)", began)
    warm_s, _ = timed(session, QUERY)
    said(f"top-k warm ({warm_s:.1f} s)", began)
    vectors, query = embedded(session, docs), embedded(session, [QUESTION])[0]
    started = time.perf_counter()
    scores = cosines(vectors, query[None])[:, 0]
    best = sorted(np.argpartition(-scores, 20)[:20], key=lambda k: (-round(float(scores[k]), 9), k))[:10]
    floor_s = time.perf_counter() - started
    sides = embedded(session, left), embedded(session, right)
    matrix = cosines(*sides)
    threshold = round(float(np.quantile(matrix, 0.999)), 4)
    said("numpy's top-k and cosines", began)
    join = f"SELECT l.id AS a, r.id AS b FROM l JOIN r ON AI_SIMILARITY(l.body, r.body) > {threshold}"
    timed(session, join)
    join_s, pairs = timed(session, join)
    said(f"join ({join_s:.1f} s, {pairs.num_rows} pairs)", began)
    want = sorted(zip(*np.nonzero(matrix > threshold)))
    per_row = ("SELECT l.id AS a, r.id AS b FROM l, r QUALIFY ROW_NUMBER() OVER (PARTITION BY l.id ORDER BY "
               f"AI_SIMILARITY(l.body, r.body) DESC, r.id) <= {K_PER_ROW}")
    timed(session, per_row)
    per_row_s, ranked = timed(session, per_row)
    said(f"top k per row ({per_row_s:.1f} s)", began)
    rounded = np.round(matrix, 12)  # a permutation of the same words differs by ~1e-11 (float32 sums), as in SQL
    kth = -np.partition(-rounded, min(K_PER_ROW, len(right)) - 1, axis=1)[:, min(K_PER_ROW, len(right)) - 1]
    firsts = sorted((a, int(b)) for a in range(len(left))  # ties at the k-th cosine broken by id, as SQL's order
                    for b in sorted(np.flatnonzero(rounded[a] >= kth[a]), key=lambda b: (-rounded[a, b], b))[:K_PER_ROW])
    gemm_s = matrix_floor(*sides, args.device)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_commit": git_commit(),
           "command": "python -m bench.embedding_queries " + " ".join(argv), "device": name, "cpus": os.cpu_count(),
           "model": session.runtime.embeddings.name, "dims": session.runtime.embeddings.dims,
           "top_k": {"rows": len(docs), "k": 10, "cold_s": round(cold_s, 3), "warm_s": round(warm_s, 3),
                     "floor_s": round(floor_s, 4),
                     "agree": got.column("id").to_pylist() == [int(k) for k in best]},
           "join": {"left": len(left), "right": len(right), "pairs_compared": len(left) * len(right),
                    "threshold": threshold, "pairs_found": pairs.num_rows, "warm_s": round(join_s, 3),
                    "gemm_floor_s": round(gemm_s, 4),
                    "agree": sorted(zip(pairs.column("a").to_pylist(), pairs.column("b").to_pylist())) ==
                    [(int(a), int(b)) for a, b in want]},
           "top_k_per_row": {"left": len(left), "right": len(right), "k": K_PER_ROW, "rows": ranked.num_rows,
                             "warm_s": round(per_row_s, 3), "gemm_floor_s": round(gemm_s, 4),
                             "agree": sorted(zip(ranked.column("a").to_pylist(), ranked.column("b").to_pylist()))
                             == firsts}}
    print(json.dumps(doc, indent=1))
    shape = session.runtime.embeddings.name.split(":")[-1].replace("/", "-")
    return write_json(Path(args.out) / f"{doc['date'][:10]}-{'cpu' if name == 'cpu' else 'gpu'}-embedding-queries-"
                      f"{shape}-{doc['git_commit'][:7]}.json", doc)


if __name__ == "__main__":
    main()
