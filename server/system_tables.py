"""System tables: live, read-only views of the server's state that any client reads with SQL."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Callable, Iterable

import duckdb
import pyarrow as pa

from quail.engine.exec.catalog import AIView, Catalog, column_of
from quail.engine.runtime.counters import Stats

from quail.server.statements import Running

QUERIES = "quail_queries"
QUERIES_SCHEMA = pa.schema([
    pa.field("query_id", pa.string(), False), pa.field("user_name", pa.string(), False),
    pa.field("query", pa.string(), False), pa.field("started", pa.timestamp("ms", "UTC"), False),
    pa.field("elapsed_s", pa.float64(), False), pa.field("requests", pa.int64(), False),
    pa.field("forward_passes", pa.int64(), False), pa.field("ai_steps_done", pa.int64(), False),
    pa.field("tokens_done", pa.int64(), False), pa.field("tokens_planned", pa.int64(), False),
    pa.field("tokens_cached", pa.int64(), False), pa.field("queue_place", pa.int64(), True),
    pa.field("tokens_generated", pa.int64(), False), pa.field("cascade_proxy_rows", pa.int64(), True),
    pa.field("cascade_model_rows", pa.int64(), True), pa.field("cascade", pa.string(), True),
])


HIDDEN = "(another user's query)"


def queries_table(running: dict[bytes, Running], viewer: str = "-", everyone: bool = True,
                  place: Callable[[Stats], int | None] = lambda stats: None) -> pa.Table:
    """One row per statement being executed, its progress in fresh tokens: done of planned so far
    (planned grows as each AI step hands its requests to the runtime), the tokens of its requests so far
    that the plan takes from resident or shared KV instead of computing (logical less planned), its
    place in the device's scheduler (`place`: 1 leads the next pass; NULL: no model work waiting), the
    tokens its generation has chosen so far, and its cascades' figures (`cascade_figures`). The
    text of another user's query shows only to a viewer who sees `everyone`'s."""
    now = time.time()
    rows = [{"query_id": handle[:8].hex(), "user_name": r.user,
             "query": r.query if everyone or r.user == viewer else HIDDEN, "started": int(r.started * 1000),
             "elapsed_s": now - r.started, "requests": r.work.stats.requests,
             "forward_passes": r.work.stats.forward_passes, "ai_steps_done": len(r.work.stages),
             "tokens_done": r.work.stats.fresh_tokens, "tokens_planned": r.work.stats.planned_tokens,
             "tokens_cached": max(0, r.work.stats.logical_tokens - r.work.stats.planned_tokens),
             "queue_place": place(r.work.stats), "tokens_generated": r.work.stats.generated_tokens,
             **cascade_figures(r.work.stages)}
            for handle, r in sorted(running.items(), key=lambda item: item[1].started)]
    return pa.Table.from_pylist(rows, schema=QUERIES_SCHEMA)


def cascade_figures(stages: list[dict]) -> dict[str, int | str | None]:
    """A statement's cascades so far (each once its thresholds are set): rows the proxy decided, rows the model
    answers (sample and band, asked or still to ask) and their EXPLAIN ANALYZE lines; NULLs without one.

    >>> cascade_figures([{"operator": "ai_filter"}])
    {'cascade_proxy_rows': None, 'cascade_model_rows': None, 'cascade': None}
    >>> cascade_figures([{"operator": "ai_cascade", "accepted": 3, "rejected": 5, "sample_rows": 4, "asked": 2,
    ...                   "remembered": 1, "line": "..."}])
    {'cascade_proxy_rows': 8, 'cascade_model_rows': 5, 'cascade': '...'}
    """
    cascades = [stage for stage in list(stages) if stage["operator"] == "ai_cascade"]
    if not cascades:
        return {"cascade_proxy_rows": None, "cascade_model_rows": None, "cascade": None}
    return {"cascade_proxy_rows": sum(s["accepted"] + s.get("rejected", 0) for s in cascades),
            "cascade_model_rows": sum(s["sample_rows"] + s["asked"] - s["remembered"] for s in cascades),
            "cascade": "\n".join(s["line"] for s in cascades)}


class WithSystemTables:
    """A catalog of stored tables plus system tables.

    Each system table is built when a statement reads it (an Arrow relation registered for the statement)."""

    def __init__(self, stored: Catalog, system: dict[str, tuple[pa.Schema, Callable[[], pa.Table]]]) -> None:
        self.stored = stored
        self.system = system

    @property
    def version(self) -> int:
        return self.stored.version

    def names(self) -> list[str]:
        return self.stored.names()

    def has(self, name: str) -> bool:
        return name.lower() in self.system or self.stored.has(name)

    def schema(self, name: str) -> pa.Schema:
        entry = self.system.get(name.lower())
        return entry[0] if entry is not None else self.stored.schema(name)

    def rows(self, name: str) -> int:
        entry = self.system.get(name.lower())
        return entry[1]().num_rows if entry is not None else self.stored.rows(name)

    def column(self, name: str, column: str) -> pa.ChunkedArray | None:
        entry = self.system.get(name.lower())
        return column_of(entry[1](), column) if entry is not None else self.stored.column(name, column)

    def relations(self, names: Iterable[str]) -> dict[str, pa.Table]:
        names = list(names)
        built = {name: self.system[name.lower()][1]() for name in names if name.lower() in self.system}
        return {**self.stored.relations(n for n in names if n.lower() not in self.system), **built}

    def relation_names(self) -> list[str]:
        return [*self.system, *self.stored.relation_names()]

    def ai_views(self) -> dict[str, AIView]:
        return self.stored.ai_views()

    def connection(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return self.stored.connection()

    def system_schemas(self) -> dict[str, pa.Schema]:
        return {name: schema for name, (schema, _) in self.system.items()}
