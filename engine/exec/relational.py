"""Relational work in DuckDB over Arrow relations; DuckDB's errors become Quail errors."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from contextlib import contextmanager
from operator import itemgetter
from typing import Iterator, Mapping

import duckdb
import pyarrow as pa

from quail.engine.errors import Cancelled, InvalidArgument, NotFound
from quail.engine.exec import sql_guard
from quail.engine.runtime.query_work import QueryWork


CONFIG = {"enable_external_access": False, "python_enable_replacements": False}  # no files, no Python objects


@functools.lru_cache(maxsize=1024)
def result_columns(schema: pa.Schema) -> list[tuple[pa.Field, str]]:
    """Each column of a table as `SELECT *` returns it (DuckDB's Arrow type, which may differ from the
    stored one: a string view comes back a string) and DuckDB's name of its SQL type."""
    row = pa.Table.from_arrays([pa.nulls(1, f.type) for f in schema], names=schema.names)
    quoted = ", ".join(f"typeof({_quoted(name)})" for name in schema.names)
    with DuckDB() as db:
        returned = db.run("SELECT * FROM t", {"t": row}).schema
        names = [c[0].as_py() for c in db.run(f"SELECT {quoted} FROM t", {"t": row}).columns] if schema.names else []
    return list(zip(returned, names))


@functools.cache
def keywords() -> frozenset[str]:
    """DuckDB's SQL keywords, upper-case."""
    with _database().cursor() as con:
        return frozenset(name.upper() for (name,) in con.sql("SELECT keyword_name FROM duckdb_keywords()").fetchall())


@functools.cache
def _database() -> duckdb.DuckDBPyConnection:
    """The process's one in-memory DuckDB database, without file access or Python objects: each query's
    statements run on a connection of their own to it (microseconds to open, where a database of its own
    takes ~15 ms), whose registered relations no other connection sees; one thread pool for all."""
    return duckdb.connect(config=CONFIG)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class DuckDB:
    """A connection of its own to the process's in-memory DuckDB (`_database`) for a query's statements,
    run one after another; each relation is registered the first time a statement sees it (again when its name
    comes to hold another table). Every statement is checked first (sql_guard.py); Python objects are
    never scanned by name. DuckDB's errors become Quail errors."""

    def __init__(self, work: QueryWork | None = None) -> None:
        self._con = _database().cursor()
        self._registered: dict[str, pa.Table] = {}
        self._work = work

    def __enter__(self) -> "DuckDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self._con.close()

    @contextmanager
    def _over(self, sql: str, relations: Mapping[str, pa.Table]) -> Iterator[duckdb.DuckDBPyConnection]:
        """The connection for a statement allowed over the relations, registered there; interrupted when the
        query is cancelled or passes its deadline (then Cancelled or DeadlineExceeded, as the query's work
        record says)."""
        work = self._work or QueryWork()
        try:
            sql_guard.check(sql, frozenset(name.lower() for name in relations))
            for name, table in relations.items():
                if self._registered.get(name.lower()) is not table:
                    self._con.register(name, table)
                    self._registered[name.lower()] = table
            with work.interruptible(self._con.interrupt):
                yield self._con
        except duckdb.InterruptException:
            work.check()
            raise Cancelled("the query was interrupted") from None
        except duckdb.CatalogException as err:
            raise NotFound(str(err)) from None
        except duckdb.Error as err:
            raise InvalidArgument(str(err)) from None

    def run(self, sql: str, relations: Mapping[str, pa.Table]) -> pa.Table:
        """Evaluate one statement over the named relations."""
        with self._over(sql, relations) as con:
            return con.sql(sql).to_arrow_table()

    def stream(self, sql: str, relations: Mapping[str, pa.Table], rows_per_batch: int) -> Iterator[pa.RecordBatch]:
        """Evaluate one statement, its rows batch by batch as DuckDB produces them (memory bounded by a batch)."""
        with self._over(sql, relations) as con:
            yield from con.sql(sql).to_arrow_reader(rows_per_batch)


class StatementSchemas:
    """The output schema of each statement DuckDB ran over relations of given schemas, the last `size` of
    them: an output schema is a function of the statement and its inputs' schemas, never of their rows, so
    finding a plan's result schema runs only the statements it has not seen (a dashboard's refresh, or the
    same projection over another range of rows, runs none). Shared by the threads planning statements."""

    def __init__(self, size: int = 1024) -> None:
        self._known: OrderedDict[tuple, pa.Schema] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def output(self, db: DuckDB, sql: str, relations: Mapping[str, pa.Table]) -> pa.Schema:
        """The schema of the statement's output over the relations: remembered, or found by running it in `db`."""
        inputs = sorted(((name.lower(), table.schema) for name, table in relations.items()), key=itemgetter(0))
        key = (sql, tuple(inputs))
        with self._lock:
            known = self._known.get(key)
            if known is not None:
                self._known.move_to_end(key)
                return known
        schema = db.run(sql, relations).schema
        with self._lock:
            self._known[key] = schema
            while len(self._known) > self._size:
                self._known.popitem(last=False)
        return schema
