"""The small catalog the rules' doctests plan their examples over, and how they print a plan."""

from __future__ import annotations

import pyarrow as pa

from quail.engine.exec.catalog import MemoryCatalog
from quail.engine.exec.plan import PhysicalPlan


def catalog() -> MemoryCatalog:
    """reviews (id, stars, body), products (id, name, price, maker) and makers (id, story)."""
    tables = MemoryCatalog()
    tables.register("reviews", pa.table({"id": [1, 2, 3], "stars": [5, 2, 4],
                                         "body": ["Lovely soup, kind staff.", "Cold and late.", "Fine."]}))
    tables.register("products", pa.table({"id": [1, 2], "name": ["soup", "bread"], "price": [4.5, 12.0],
                                          "maker": [1, 2]}))
    tables.register("makers", pa.table({"id": list(range(1, 41)),
                                        "story": [f"Maker {i}, est. {1900 + i}." for i in range(40)]}))
    return tables


def show(sql: str, without: str | None = None) -> None:
    """Print the plan of `sql` (DuckDB dialect), a line per step, planned with every rule but `without`."""
    for step in _plan(sql, without).steps:
        print("\n".join(step.describe()))


def notes(sql: str, without: str | None = None) -> None:
    """Print the planner's notes on `sql`'s plan, planned with every rule but `without`."""
    for note in _plan(sql, without).notes:
        print(note)


def _plan(sql: str, without: str | None) -> PhysicalPlan:
    from quail.planner.planner import plan_sql
    from quail.planner.rules import RULES

    return plan_sql(sql, catalog(), "duckdb", rules=tuple(r for r in RULES if r.__name__ != without))
