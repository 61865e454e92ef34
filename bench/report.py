"""Turn a result file (default: the newest run in bench/results) into a Markdown table and a PNG chart.

    python -m bench.report [RESULT.json ...]

Writes RESULT.md and RESULT.png beside the (first) file and prints the table. Without a file it takes
the run result file (BENCHMARK.md, "Result file") with the latest `date` in bench/results, passing over
the other JSON files kept there (GPU checks, probes, fuzz, soak, stress, server load). Several files are parts
of one run split over processes or GPUs (same model, precision, scale, seed and commit): their
queries are shown together.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
BASELINES = ("naive", "prefix", "hf")
# Top-level keys every run result file has (BENCHMARK.md, "Result file") and the table needs.
RUN_KEYS = ("device", "model", "weights", "precision", "decisions", "scale", "seed", "git_commit", "date",
            "queries")


def run_date(path: Path) -> str | None:
    """The `date` of a run result file; None for any other file (not JSON, or not a run's)."""
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        return None
    if not isinstance(doc, dict) or any(key not in doc for key in RUN_KEYS) or not isinstance(doc["queries"], dict):
        return None
    return doc["date"]


def newest(directory: Path = RESULTS) -> Path:
    """The run result file in `directory` with the latest `date`."""
    dated = [(date, path) for path in directory.glob("*.json") if (date := run_date(path)) is not None]
    if not dated:
        raise SystemExit(f"no benchmark run result files in {directory} (JSON with the keys {', '.join(RUN_KEYS)}); "
                         "give the result file's path")
    return max(dated)[1]


SAME_IN_PARTS = ("model", "weights", "precision", "decisions", "scale", "length_scale", "seed", "git_commit")


def combine(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Parts of one run as one document: the first part's header, every part's queries (first wins)."""
    first = docs[0]
    for doc in docs[1:]:
        differ = [k for k in SAME_IN_PARTS if doc.get(k) != first.get(k)]
        if differ:
            raise SystemExit(f"result files are not parts of one run: they differ in {differ}")
    queries: dict[str, Any] = {}
    for doc in docs:
        for query, entry in doc["queries"].items():
            queries.setdefault(query, entry)
    return {**first, "queries": queries, "parts": len(docs)}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def speedups(engines: dict[str, Any]) -> dict[str, float]:
    """quail's speedup over each baseline that ran (baseline wall / quail wall)."""
    quail = engines.get("quail")
    if not quail:
        return {}
    return {b: engines[b]["wall_s"] / quail["wall_s"] for b in BASELINES if b in engines}


def markdown(doc: dict[str, Any]) -> str:
    head = (f"**{doc['model']}** ({doc['weights']}, {doc['precision']}, decisions: {doc['decisions']}) on "
            f"**{doc['device']}**, scale {doc['scale']}, length scale {doc.get('length_scale', 1.0)}, "
            f"seed {doc['seed']}, commit {doc['git_commit'][:7]}, {doc['date']}"
            + (f", {doc['parts']} parts run side by side (one process per GPU)" if doc.get("parts", 1) > 1 else "")
            + "\n\n")
    lines = ["| query | engine | wall s | rows | agree | logical tok | logical tok/s | fresh tok | cached tok "
             "| KV regret | SoL s | SoL frac | quail speedup | $ |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for query, entry in doc["queries"].items():
        if "error" in entry:
            lines.append(f"| {query} | – | not run: {entry['error']} |" + " |" * 11)
            continue
        ups = speedups(entry["engines"])
        for engine, f in entry["engines"].items():
            up = "" if engine == "quail" else _fmt(ups.get(engine)) + "×"
            lines.append(
                f"| {query} | {engine} | {_fmt(f['wall_s'])} | {f['rows']} | {_fmt(f['agree'])} "
                f"| {_fmt(f['logical_tokens'])} | {_fmt(f['logical_tokens_per_s'], 0)} | {_fmt(f['fresh_tokens'])} "
                f"| {_fmt(f['cached_tokens'])} | {_fmt(f['kv_regret_tokens'])} | {_fmt(f['sol_s'], 3)} "
                f"| {_fmt(f['sol_fraction'])} | {up} | {_fmt(f['usd'], 5)} |")
    return head + "\n".join(lines) + "\n"


def chart(doc: dict[str, Any], path: Path) -> None:
    """Quail's speedup over each baseline, and each engine's SoL fraction, per query."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queries = [q for q, e in doc["queries"].items() if "error" not in e and "quail" in e["engines"]]
    engines = [e for e in ("quail", *BASELINES) if any(e in doc["queries"][q]["engines"] for q in queries)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(engines))
    for k, engine in enumerate(engines):
        xs = [i + k * width for i in range(len(queries))]
        if engine != "quail":
            left.bar(xs, [speedups(doc["queries"][q]["engines"]).get(engine, 0) for q in queries], width,
                     label=f"vs {engine}")
        fractions = [(doc["queries"][q]["engines"].get(engine) or {}).get("sol_fraction") or 0 for q in queries]
        right.bar(xs, fractions, width, label=engine)
    for ax, title in ((left, "Quail speedup (baseline wall / quail wall)"), (right, "speed-of-light fraction")):
        ax.set_xticks([i + width * (len(engines) - 1) / 2 for i in range(len(queries))], queries)
        ax.set_title(title)
        ax.legend()
    left.axhline(1.0, color="grey", linewidth=0.8)
    right.axhline(0.5, color="grey", linewidth=0.8, linestyle="--")
    fig.suptitle(f"{doc['model']} {doc['precision']} on {doc['device']}, scale {doc['scale']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="*", type=Path)
    args = p.parse_args(argv)
    paths = args.results or [newest()]
    path = paths[0]
    doc = combine([json.loads(p.read_text()) for p in paths])
    table = markdown(doc)
    path.with_suffix(".md").write_text(table)
    chart(doc, path.with_suffix(".png"))
    print(table)


if __name__ == "__main__":
    main()
