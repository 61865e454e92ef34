"""Measure structured output: AI_COMPLETE answering in JSON that follows a schema, every value checked.

    python -m bench.structured_output [--rows 200] [--model NAME] [--out DIR]

Support tickets (a product and a problem each) are asked for their product, a
severity and whether a refund is asked, with a response_format JSON schema;
the file records how many answers parse and validate against the schema (all
of them must), the tokens generated, decode steps and wall seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path

import jsonschema
import pyarrow as pa

import quail

TICKET = {"type": "object", "additionalProperties": False, "required": ["product", "severity", "refund"],
          "properties": {"product": {"type": "string", "maxLength": 30},
                         "severity": {"type": "integer", "minimum": 0, "maximum": 10},
                         "refund": {"type": "boolean"}}}
PRODUCTS = ["blender", "kettle", "headphones", "jacket", "lamp", "desk chair", "phone case", "tent"]
PROBLEMS = ["broke after two days", "arrived late", "is the wrong size", "works fine but is noisy",
            "never arrived", "was cheaper elsewhere", "smells odd", "is perfect, thank you"]
ASK = "Describe the product, the severity and whether a refund is asked in {0}."


def tickets(rows: int) -> pa.Table:
    return pa.table({"id": list(range(rows)),
                     "body": [f"Ticket {i}: my {PRODUCTS[i % 8]} {PROBLEMS[i // 8 % 8]}. Order {1000 + 7 * i}."
                              for i in range(rows)]})


def query(max_tokens: int = 120) -> str:
    """AI_COMPLETE over the tickets table, its schema given as JSON text."""
    return (f"SELECT id, AI_COMPLETE(PROMPT('{ASK}', body), {{'max_tokens': {max_tokens}, "
            f"'response_format': '{json.dumps(TICKET)}'}}) AS answer FROM tickets ORDER BY id")


def valid(answer: str) -> bool:
    try:
        jsonschema.validate(json.loads(answer), TICKET)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.structured_output", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--model", default=None, help="model name (default: the embedded SmolLM2)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    session = quail.Session(quail.EngineConfig(model=args.model))
    session.register("tickets", tickets(args.rows))
    started = time.perf_counter()
    result = session.sql(query()).run()
    wall = time.perf_counter() - started
    answers = result.table.column("answer").to_pylist()
    now = dt.datetime.now(dt.timezone.utc)
    doc = {"date": now.isoformat(timespec="seconds"), "model": args.model or "smollm2-135m (embedded)",
           "rows": args.rows, "schema": TICKET, "valid": sum(map(valid, answers)), "distinct": len(set(answers)),
           "generated_tokens": result.report.generated_tokens, "decode_steps": result.report.decode_steps,
           "fresh_tokens": result.report.fresh_tokens, "wall_s": wall, "examples": answers[:8]}
    path = Path(args.out) / f"{now:%Y-%m-%d}-cpu-structured-output.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("rows", "valid", "distinct", "generated_tokens", "wall_s")}))
    print(path)
    if doc["valid"] != args.rows:
        raise SystemExit(f"{args.rows - doc['valid']} answers do not follow the schema")


if __name__ == "__main__":
    main()
