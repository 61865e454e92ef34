"""Relational work in DuckDB, its errors made Quail's.

Statements run over a connection with Arrow relations registered beside its tables.

- `DuckDB` runs one query's statements on one connection (the database's, or the process's in-memory one),
  registering each Arrow relation a statement reads under its name (a relation shadows a table of the
  same name) and dropping them again when the query is done.
- `statement_schema` is what a statement returns, found by DuckDB's binder without running it.
- `duckdb_errors` is the one translation of DuckDB's exceptions to Quail's errors.
"""

from __future__ import annotations

import functools
import re
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Iterator, Mapping, Sequence

import duckdb
import pyarrow as pa
from duckdb import _seam  # DuckDB's binder (a statement's output without running it) and its one-step submit

from quail.engine import errors
from quail.engine.errors import (Aborted, AlreadyExists, Cancelled, InvalidArgument, NotFound, PermissionDenied,
                                 QuailError, ResourceExhausted)
from quail.engine.exec import sql_guard
from quail.engine.runtime.query_work import WORK_VARIABLE, QueryWork, Works


CONFIG = {"enable_external_access": False, "python_enable_replacements": False,  # no files, no Python objects
          "autoinstall_known_extensions": False, "autoload_known_extensions": False}


@functools.cache
def memory_database() -> duckdb.DuckDBPyConnection:
    """The process's one in-memory DuckDB database, without file access or Python objects: the in-process API's
    statements run on connections of their own to it (microseconds to open, where a database of its own
    takes ~15 ms), whose registered relations no other connection sees; one thread pool for all."""
    return duckdb.connect(config=CONFIG)


@functools.lru_cache(maxsize=1024)
def result_columns(schema: pa.Schema) -> list[tuple[pa.Field, str]]:
    """Each column of a table as `SELECT *` returns it (DuckDB's Arrow type, which may differ from the
    stored one: a string view comes back a string) and DuckDB's name of its SQL type."""
    row = pa.Table.from_arrays([pa.nulls(1, f.type) for f in schema], names=schema.names)
    quoted = ", ".join(f"typeof({quoted_name(name)})" for name in schema.names)
    with memory_database().cursor() as con:
        con.register("t", row)
        returned = con.sql("SELECT * FROM t").to_arrow_table().schema
        names = [c[0].as_py() for c in con.sql(f"SELECT {quoted} FROM t").to_arrow_table().columns] \
            if schema.names else []
    return list(zip(returned, names))


@functools.cache
def keywords() -> frozenset[str]:
    """DuckDB's SQL keywords, upper-case."""
    with memory_database().cursor() as con:
        return frozenset(name.upper() for (name,) in con.sql("SELECT keyword_name FROM duckdb_keywords()").fetchall())


def quoted_name(name: str) -> str:
    """A name as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


@contextmanager
def duckdb_errors(work: QueryWork | None = None) -> Iterator[None]:
    """DuckDB's exceptions as Quail errors: an interrupt is Cancelled (or DeadlineExceeded, as `work` says);
    a duplicate key or name AlreadyExists; an unknown name NotFound; a write-write conflict between
    transactions Aborted (another transaction error, such as one already failed, InvalidArgument); file
    access PermissionDenied; memory ResourceExhausted; the rest InvalidArgument. Their texts as the user may
    read them (user_text)."""
    try:
        yield
    except duckdb.InterruptException:
        if work is not None:
            work.check()
        raise Cancelled("the query was interrupted") from None
    except duckdb.Error as err:
        raise _quail_error(err) from None


def _quail_error(err: duckdb.Error) -> QuailError:
    text = user_text(str(err))
    raised = _UDF_ERROR.search(text)  # a function of Quail's that DuckDB ran (embedding_functions.py) raised it
    kind = getattr(errors, raised[1], None) if raised is not None else None
    if isinstance(kind, type) and issubclass(kind, QuailError):
        return kind(raised[2])
    if isinstance(err, duckdb.ConstraintException):
        return (AlreadyExists if "Duplicate key" in text else InvalidArgument)(text)
    if isinstance(err, duckdb.CatalogException):
        return (AlreadyExists if "already exists" in text else NotFound if "not exist" in text else InvalidArgument)(
            text)
    if isinstance(err, duckdb.TransactionException):
        return InvalidArgument(text) if "onflict" not in text else \
            Aborted(f"{text} (another transaction changed the same rows or objects: try again)")
    if isinstance(err, duckdb.PermissionException):
        return PermissionDenied(f"{text}: Quail's statements reach only its own database")
    if isinstance(err, duckdb.OutOfMemoryException):
        return ResourceExhausted(text)
    return InvalidArgument(text)


_UDF_ERROR = re.compile(r"Python exception occurred while executing the UDF: (\w+): (.*)", re.DOTALL)
_INTERNAL = re.compile(r'(?:"[^"]*"\.)?"?__quail_\w+"?', re.IGNORECASE)


def user_text(message: str) -> str:
    """DuckDB's message about a statement Quail wrote (a step of an AI plan) without what the user never wrote:
    the statement's text (DuckDB's `LINE n:` context) and the names of Quail's own columns and tables.

    >>> user_text("Conversion Error: cannot convert 'a' to DOUBLE\\n\\nLINE 1: ... ORDER BY d.__quail_ai_1")
    "Conversion Error: cannot convert 'a' to DOUBLE"
    >>> user_text('Binder Error: column "__quail_ai_2" is ambiguous')
    "Binder Error: column an AI function's answer is ambiguous"
    """
    if "__quail" not in message.lower():
        return message
    return _INTERNAL.sub("an AI function's answer", message.split("\nLINE ", 1)[0].rstrip())


@dataclass(frozen=True)
class Signature:
    """What DuckDB's binder says of a statement, nothing run.

    What DuckDB's binder says of a statement: what it returns (rows, or a count or nothing), whether running
    it changes the database (a sequence's nextval does too), and how many parameters it has."""

    schema: pa.Schema
    returns_rows: bool
    writes: bool
    parameters: int


def statement_signature(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None) -> Signature:
    """A statement's signature on this connection, from DuckDB's binder: nothing runs. `params`: the values of
    its parameters (None: not bound yet; a column whose type depends on one is then typed null)."""
    with duckdb_errors():
        bound = _seam.bind(con, sql, values=list(params) if params is not None else None)
        parameters = len(params) if params is not None else len(bound.parameters)
        if params is None and parameters and any(str(kind) == "UNKNOWN" for kind in bound.types):
            bound = _bind_probed(con, sql, parameters)
        known = [k for k, kind in enumerate(bound.types) if str(kind) not in ("UNKNOWN", '"NULL"')]
        arrow = _seam.arrow_schema(con, [bound.names[k] for k in known], [bound.types[k] for k in known])
    fields = dict(zip(known, arrow))
    schema = pa.schema([fields[k].with_name(name) if k in fields else pa.field(name, pa.null())
                        for k, name in enumerate(bound.names)])  # names as DuckDB gives them, duplicates kept
    return Signature(schema, bound.return_type == "query_result", bound.writes, parameters)


_PROBES = (None, "", b"", 0, 0.0)  # what a parameter of no type is tried as: NULL, text, blob, integer, double


def _bind_probed(con: duckdb.DuckDBPyConnection, sql: str, count: int) -> Any:
    """DuckDB's binding of a statement whose parameters have no values yet and leave a column of no type:
    bound with every parameter a value of each of _PROBES' types in turn (the first that binds). NULL keeps
    the names as written; a function of several overloads cannot pick one for NULL (`octet_length(?)`: BLOB
    or BIT), and binds with one of the others: the schema a prepare answers. The values, when they come,
    bind the statement again."""
    first = None
    for probe in _PROBES:
        try:
            return _seam.bind(con, sql, values=[probe] * count)
        except duckdb.Error as err:
            first = first or err
    raise first


def statement_schema(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Schema:
    """The Arrow schema of what a statement returns on this connection (statement_signature)."""
    return statement_signature(con, sql).schema


class DuckDB:
    """One query's statements, run one after another on a connection.

    (`connection`; by default one of its own
    to the in-memory database, closed at the end). Each Arrow relation is registered the first time a
    statement sees it (again when its name comes to hold another table) and unregistered at the end; every
    statement is checked first (sql_guard.py); DuckDB's errors become Quail errors. With `works`, a statement
    that reads its work's key (WORK_VARIABLE: a similarity join's pairs) finds it set on the connection, the
    work held there until the end."""

    def __init__(self, work: QueryWork | None = None, connection: duckdb.DuckDBPyConnection | None = None,
                 works: Works | None = None) -> None:
        self._own = connection is None
        self._con = memory_database().cursor() if connection is None else connection
        self._registered: dict[str, pa.Table] = {}
        self._work = work
        self._works = works
        self._key: str | None = None  # the work's key in `works`, once a statement reads it

    def __enter__(self) -> "DuckDB":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._key is not None:
            self._works.drop(self._key)  # the variable may stay on the connection: the key finds nothing now
        if self._own:
            self._con.close()
            return
        for name in self._registered:
            self._con.unregister(name)

    def _hold(self, work: QueryWork, sql: str) -> None:
        """Where the statement reads the key of its work (a similarity join's functions: WORK_VARIABLE), hold
        the work in `works` and set the variable on the connection (once for all the statements)."""
        if self._works is not None and self._key is None and WORK_VARIABLE in sql:
            self._key = self._works.hold(work)
            self._con.execute(f"SET VARIABLE {WORK_VARIABLE} = '{self._key}'")

    @contextmanager
    def _over(self, sql: str, relations: Mapping[str, pa.Table]) -> Iterator[duckdb.DuckDBPyConnection]:
        """The connection for a statement allowed over the relations, registered there; interrupted when the
        query is cancelled or passes its deadline (then Cancelled or DeadlineExceeded, as the query's work
        record says)."""
        work = self._work or QueryWork()
        sql_guard.check(sql)
        with duckdb_errors(work):
            self._hold(work, sql)
            for name, table in relations.items():
                if self._registered.get(name.lower()) is not table:
                    self._con.register(name, table)
                    self._registered[name.lower()] = table
            with work.interruptible(self._con.interrupt):
                yield self._con

    def run(self, sql: str, relations: Mapping[str, pa.Table], params: Sequence[Any] | None = None) -> pa.Table:
        """Evaluate one statement over the named relations (DuckDB's submit: one parse and bind, where its
        relation API would take another)."""
        with self._over(sql, relations) as con:
            return _seam.submit(con, sql, list(params) if params else None, "arrow").arrow_table()

    def stream(self, sql: str, relations: Mapping[str, pa.Table], rows_per_batch: int,
               params: Sequence[Any] | None = None) -> Iterator[pa.RecordBatch]:
        """Evaluate one statement, its rows batch by batch as DuckDB produces them (memory bounded by a batch)."""
        with self._over(sql, relations) as con:
            yield from _seam.submit(con, sql, list(params) if params else None, "stream",
                                    rows_per_batch).arrow_reader()

    def signature(self, sql: str, relations: Mapping[str, pa.Table],
                  params: Sequence[Any] | None = None) -> Signature:
        """What DuckDB's binder says of the statement over the relations (statement_signature: nothing runs)."""
        with self._over(sql, relations) as con:
            return statement_signature(con, sql, params)

    def schema(self, sql: str, relations: Mapping[str, pa.Table], params: Sequence[Any] | None = None) -> pa.Schema:
        """What the statement would return over the relations (nothing runs)."""
        return self.signature(sql, relations, params).schema


class StatementSchemas:
    """Output schemas of the statements DuckDB bound, remembered by statement and inputs.

    The output schema of each statement DuckDB bound over relations of given schemas and a catalog at a given
    version, the last `size` of them: an output schema is a function of the statement, its inputs' schemas
    and the stored tables', never of their rows, so finding a plan's result schema binds only the
    statements it has not seen (a dashboard's refresh, or the same projection over another range of rows,
    binds none). Shared by the threads planning statements."""

    def __init__(self, size: int = 1024) -> None:
        self._known: OrderedDict[tuple, pa.Schema] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def output(self, db: DuckDB, sql: str, relations: Mapping[str, pa.Table], version: int,
               params: Sequence[Any] = ()) -> pa.Schema:
        """The schema of the statement's output over the relations: remembered, or found by binding it in `db`
        (a statement with parameter values is bound each time: its types are theirs)."""
        if params:
            return db.schema(sql, relations, params)
        inputs = sorted(((name.lower(), table.schema) for name, table in relations.items()), key=itemgetter(0))
        key = (sql, tuple(inputs), version)
        with self._lock:
            known = self._known.get(key)
            if known is not None:
                self._known.move_to_end(key)
                return known
        schema = db.schema(sql, relations)
        with self._lock:
            self._known[key] = schema
            while len(self._known) > self._size:
                self._known.popitem(last=False)
        return schema
