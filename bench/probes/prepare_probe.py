"""GPU probe: the host's milliseconds to prepare a short statement, as the resident tree grows (in-process).

A phase-B statement (bench/server_load.py: 20 rows, AI_FILTER) planned as the
server plans it at CreatePreparedStatement (plan_statement: no expected resident
documents), the same plan with them as EXPLAIN and the Python API plan it
(plan_sql with the KV pool's view, Runtime.resident_share), the view alone over
the column, and the result schema (DuckDB over empty tables; each statement over
rows no earlier one read, so no statement's schema is remembered). Measured
with an empty tree, after a 640-row statement, and after 32 more 20-row ones.
Writes prepare-<tag>.json to --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Callable

import quail
from bench.datagen import numbered_reviews
from bench.probes.engine_args import add_engine_arguments, engine_config
from bench.server_load import statement
from quail.engine.exec.executor import result_schema
from quail.planner.planner import plan_sql
from quail.planner.updates import plan_statement

REPEATS = 30


def mean_ms(fn: Callable[[str], object], statements: itertools.count) -> float:
    """Mean milliseconds of fn over REPEATS new statements, after one unmeasured."""
    fn(statement(next(statements), 20))
    texts = [statement(next(statements), 20) for _ in range(REPEATS)]
    started = time.perf_counter()
    for text in texts:
        fn(text)
    return round(1000 * (time.perf_counter() - started) / REPEATS, 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    session = quail.Session(engine_config(args))
    reviews = numbered_reviews(5000, 300)
    session.register("reviews", reviews)
    session.runtime.warm_up()
    service, catalog, runtime = session.service, session.catalog, session.runtime
    texts, firsts = reviews.column("body"), itertools.count(2000, 3)  # rows no statement below asks about

    def planned(text: str):
        return plan_statement(text, catalog, "snowflake", None, None, runtime.resident_share)

    result = {}
    for name, before in (("empty", []), ("after_640_rows", [(0, 640)]),
                         ("after_32_more", [(700 + 20 * k, 20) for k in range(32)])):
        for first, rows in before:
            session.sql(statement(first, rows)).run()
        result[name] = {
            "tree_tokens": runtime.runner.tree.tokens,
            "resident_share_ms": mean_ms(lambda _: runtime.resident_share(texts), firsts),
            "plan_ms": mean_ms(planned, firsts),
            "plan_with_expected_documents_ms": mean_ms(
                lambda text: plan_sql(text, catalog, "snowflake", resident=runtime.resident_share), firsts),
            "result_schema_ms": mean_ms(lambda text: result_schema(planned(text), catalog, None, service.schemas),
                                        firsts),
        }
        result[name]["result_schema_ms"] = round(result[name]["result_schema_ms"]  # timed with its plan: less the plan
                                                 - result[name]["plan_ms"], 3)
    text = json.dumps(result, indent=1)
    print(text)
    Path(args.out, f"prepare{args.tag}.json").write_text(text)


if __name__ == "__main__":
    main()
