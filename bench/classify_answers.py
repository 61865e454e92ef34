"""Measure how AI_CLASSIFY should let the model answer: by letter (one token) or by name (label trie).

    python -m bench.classify_answers [--model NAME] [--out DIR]

A labeled set of short reviews (each written about one category) is classified
both ways through the public API; the file records accuracy, model requests,
fresh tokens and wall time per way, for one label set whose names part at their
first token and one whose names share first tokens (more trie branch points).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path

import pyarrow as pa

import quail

TEXTS = {
    "food": ["The pasta was overcooked and bland.", "Their lamb curry is the best I have eaten.",
             "The soup arrived cold and too salty.", "Fresh bread, rich sauces, perfect dessert.",
             "The steak was tough and the fries soggy.", "Delicious sushi with very fresh fish.",
             "The pizza crust was burnt on the bottom.", "A tasty omelette with herbs and cheese."],
    "price": ["Far too expensive for such small portions.", "Great value, the lunch menu costs ten euros.",
              "The bill was outrageous for two coffees.", "Cheap drinks and affordable mains.",
              "They charged us twice for the wine.", "Prices went up again, not worth the money.",
              "Reasonably priced for the city centre.", "Overpriced cocktails, we paid forty dollars."],
    "service": ["The waiter was rude and ignored us.", "Staff were friendly and very attentive.",
                "We waited an hour before anyone took our order.", "The manager apologised and helped at once.",
                "Our server forgot half of the order.", "Quick, polite and helpful service all night.",
                "The waitress rolled her eyes at our questions.", "Excellent hosts who made us feel welcome."],
    "noise": ["So loud we could not hear each other talk.", "The music was blasting all evening.",
              "A quiet room, perfect for a conversation.", "Screaming kids at the next table the whole time.",
              "The kitchen clatter was deafening.", "Calm and silent, you can hear a pin drop.",
              "Noisy crowd at the bar, impossible to relax.", "The street noise came straight through the windows."],
}
NAME_SETS = {"distinct-first-tokens": ["food", "price", "service", "noise"],
             "shared-first-tokens": ["the food", "the price", "the service", "the noise"]}


def labeled() -> pa.Table:
    rows = [(text, name) for name, texts in TEXTS.items() for text in texts]
    return pa.table({"id": list(range(len(rows))), "body": [t for t, _ in rows], "truth": [n for _, n in rows]})


def measure(session: quail.Session, table: pa.Table, names: list[str], answers: str) -> dict:
    listed = ", ".join(f"'{n}'" for n in names)
    sql = (f"SELECT id, AI_CLASSIFY(PROMPT('What is the review {{0}} mostly about?', body), [{listed}], "
           f"{{'answers': '{answers}'}}):labels[0]::string AS label FROM reviews ORDER BY id")
    started = time.perf_counter()
    result = session.sql(sql).run()
    wall = time.perf_counter() - started
    got = result.collect().column("label").to_pylist()
    truth = [names[list(TEXTS).index(t)] for t in table.column("truth").to_pylist()]
    chosen = {n: got.count(n) for n in names}
    return {"accuracy": sum(g == t for g, t in zip(got, truth)) / len(truth), "chosen": chosen,
            "requests": result.report.requests, "fresh_tokens": result.report.fresh_tokens,
            "logical_tokens": result.report.logical_tokens, "wall_s": wall}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.classify_answers", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model name (default: the embedded SmolLM2)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    session = quail.Session(quail.EngineConfig(model=args.model))
    table = labeled()
    session.register("reviews", table)
    results = {label_set: {answers: measure(session, table, names, answers) for answers in ("letters", "names")}
               for label_set, names in NAME_SETS.items()}
    now = dt.datetime.now(dt.timezone.utc)
    doc = {"date": now.isoformat(timespec="seconds"), "model": args.model or "smollm2-135m (embedded)",
           "rows": table.num_rows, "name_sets": NAME_SETS, "results": results}
    path = Path(args.out) / f"{now:%Y-%m-%d}-cpu-classify-answers.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    print(path)


if __name__ == "__main__":
    main()
