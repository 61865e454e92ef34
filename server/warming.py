"""Tokenizing the texts of tables as they are written, on a thread of its own, so the queries over them do not.

- Best effort, never the write's error: a failure is logged, and a server
  stopping warms nothing more.
- The `quail_texts_warming` gauge counts the texts not reached yet.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa

from quail.engine.runtime.runtime import Runtime
from quail.planner.binder import is_text
from quail.server.metrics import Metrics

log = logging.getLogger("quail.server")
WARM_ROWS = 1024  # rows of a text column the warming thread tokenizes at a time


class Warming:
    """Tokenizes rows' text columns as documents (Runtime.warm), WARM_ROWS at a time."""

    def __init__(self, runtime: Runtime, metrics: Metrics) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.pool = ThreadPoolExecutor(1, "quail-warm")

    def stop(self) -> None:
        """Warm nothing more: the tasks not begun are dropped (the server is stopping)."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    def warm(self, rows: pa.Table) -> None:
        """Have the text columns of rows just stored tokenized on the warming thread."""
        for column in (c for c in rows.columns if is_text(c.type)):
            for start in range(0, len(column), WARM_ROWS):
                part = column.slice(start, WARM_ROWS)
                self.metrics.warming.inc(len(part))
                try:  # off the gauge once its task is done, whether it ran or was cancelled as the server stops
                    self.pool.submit(self._warm, part).add_done_callback(
                        lambda _, texts=len(part): self.metrics.warming.dec(texts))
                except RuntimeError:  # the warming thread was shut down: the server is stopping
                    self.metrics.warming.dec(len(part))
                    return

    def table(self, con: duckdb.DuckDBPyConnection, table: str) -> None:
        """Warm the text columns of a table (`table` as DuckDB names it: one just created, or kept from before
        the server started), read on a connection that sees it."""
        try:
            rows = con.sql(f"SELECT * FROM {table}").to_arrow_table()
        except duckdb.Error:
            log.exception("reading the table %s to tokenize its texts failed", table)
            return
        self.warm(rows)

    def _warm(self, texts: pa.ChunkedArray) -> None:
        try:
            self.runtime.warm(texts)
        except Exception:
            log.exception("tokenizing a table's texts as it was written failed (its queries will tokenize them)")
