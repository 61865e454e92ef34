"""SQL logic files (tests/sql/*.slt) run on DuckDB in-process and on a real Quail server, compared.

Each file runs top to bottom on one connection per engine: a fresh in-memory `duckdb.connect()`, and one
ADBC Flight SQL connection to the server, made with the cookie middleware and opened as a session by
setting its `dialect` option to `duckdb` (so temp tables and SQL transactions live as long as the file).
`test_file_on_duckdb` checks a file against DuckDB alone (no server: the files' expected results are what
DuckDB gives); `test_file_on_quail` runs DuckDB and Quail side by side, and every record where either misses
the file's expectation or the two disagree is a failure, reported with its file, line, SQL and both outcomes.
`pytest tests/server/test_sqllogic.py -k duckdb` checks the files alone.

The file format, a subset of sqllogictest:

    # a comment line (also allowed between records)
    statement ok
    <SQL, one statement, possibly over several lines, ended by a blank line>

    statement error [substring expected in the error message]
    <SQL>

    query <types> [rowsort|nosort] [colnames]
    <SQL>
    ----
    [column names, tab-separated, when `colnames` is given]
    <expected rows, one a line, values separated by one tab>

`<types>` has one letter per result column (I integer, R float, T anything else); only its length is checked,
against the result's column count. `rowsort` compares the rows as sorted lines, `nosort` (the default) in
order. SQL is sent as written, one record's text as one statement; the runner splits nothing.

Values are rendered from Arrow on both sides alike (`render`): NULL; true / false; floats by `repr` (a
32-bit float as the shortest decimal that reads back as the same 32-bit value); text as is, with backslash
escapes for tab, newline and backslash; bytes as hex; `(empty)` for empty text or bytes; Decimal and UUID by
`str`; dates, times and timestamps in ISO format (with a time zone: in UTC); intervals as
`<m> months <d> days <n> ns`; lists `[a, b]`, structs `{'k': v}` and maps `{k=v}`, their text members quoted by
`repr`. Column types are not compared, but a value of another type mostly renders otherwise (90.2 as FLOAT is
`90.2`, as DOUBLE `90.19999694824219`).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import adbc_driver_flightsql
import adbc_driver_flightsql.dbapi as flight_sql
import duckdb
import numpy as np
import pyarrow as pa
import pytest

from quail.remote import set_session_options

SQL_DIR = Path(__file__).resolve().parents[1] / "sql"
SLT_FILES = sorted(SQL_DIR.glob("*.slt"))
COOKIES = {adbc_driver_flightsql.DatabaseOptions.WITH_COOKIE_MIDDLEWARE.value: "true"}
SHOWN_ROWS = 20  # rows of an outcome quoted in a failure
SHOWN_ERROR = 400  # characters of an error message quoted in a failure
NAMES_DIFFER = "the column names differ"


@dataclass(frozen=True)
class Record:
    """One statement or query of a file. `error`: for `statement error`, the substring its message must hold
    ('' for any error); None where the SQL must succeed. `expected`: the lines after `----` (the column names'
    line first where `colnames`)."""
    path: Path
    line: int
    sql: str
    is_query: bool = False
    error: str | None = None
    columns: int = 0
    rowsort: bool = False
    colnames: bool = False
    expected: tuple[str, ...] = ()

    def where(self) -> str:
        """`file:line` of the record's header, the file relative to the repository."""
        return f"{self.path.relative_to(SQL_DIR.parents[1])}:{self.line}"


@dataclass(frozen=True)
class Outcome:
    """What one engine made of a record: its error message (None: it succeeded), and for a query the result's
    column names and rendered rows (each row's values joined by tabs)."""
    error: str | None
    names: tuple[str, ...] = ()
    rows: tuple[str, ...] = ()

    def describe(self) -> str:
        """The outcome in one or a few lines, for a failure message."""
        if self.error is not None:
            return f"error: {self.error[:SHOWN_ERROR]}"
        if not self.names:
            return "ok"
        lines = [f"columns {list(self.names)}, {len(self.rows)} rows", *self.rows[:SHOWN_ROWS]]
        if len(self.rows) > SHOWN_ROWS:
            lines.append("...")
        return "\n      ".join(lines)


def _blocks(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """The file's records as (1-based line of the header, the record's lines), split at blank lines, with
    comment lines outside records dropped."""
    start, block = 0, []
    for number, line in enumerate([*lines, ""], start=1):
        if line.strip():
            if block or not line.startswith("#"):
                start = start if block else number
                block.append(line)
        elif block:
            yield start, block
            block = []


def _record(path: Path, line: int, block: list[str]) -> Record:
    """One record from its lines (the header first); a malformed header raises ValueError naming the line."""
    words = block[0].split()
    body = block[1:]
    if words[:2] == ["statement", "ok"] and len(words) == 2:
        return Record(path, line, "\n".join(body))
    if words[:2] == ["statement", "error"]:
        return Record(path, line, "\n".join(body), error=block[0].strip()[len("statement error"):].strip())
    options = set(words[2:])
    if words[0] == "query" and len(words) >= 2 and "----" in body and options <= {"rowsort", "nosort", "colnames"}:
        split = body.index("----")
        return Record(path, line, "\n".join(body[:split]), is_query=True, columns=len(words[1]),
                      rowsort="rowsort" in options, colnames="colnames" in options,
                      expected=tuple(body[split + 1:]))
    raise ValueError(f"{path}:{line}: not a record: {block[0]!r}")


def parse(path: Path) -> list[Record]:
    """The records of one .slt file, in order."""
    return [_record(path, line, block) for line, block in _blocks(path.read_text().splitlines())]


def _float32(value: float) -> str:
    """The shortest decimal that reads back as the same 32-bit float, as Python writes a float."""
    return repr(float(str(np.float32(value))))


def _python(value: object) -> str:
    """A plain Python value (from `as_py`) as text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (str, bytes)) and not value:
        return "(empty)"
    if isinstance(value, str):
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.timezone.utc).isoformat()
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, pa.MonthDayNano):
        return f"{value.months} months {value.days} days {value.nanoseconds} ns"
    return str(value)


def _member(scalar: pa.Scalar) -> str:
    """A value inside a list, struct or map: text quoted by `repr`, anything else as `render` writes it."""
    if scalar.is_valid and (pa.types.is_string(scalar.type) or pa.types.is_large_string(scalar.type)):
        return repr(scalar.as_py())
    return render(scalar)


def render(scalar: pa.Scalar) -> str:
    """One Arrow value in the canonical text both engines' results are compared in (the module docstring)."""
    kind = scalar.type
    if not scalar.is_valid:
        return "NULL"
    if pa.types.is_float32(kind):
        return _float32(scalar.as_py())
    if pa.types.is_dictionary(kind) or pa.types.is_union(kind):
        return render(scalar.value)
    if pa.types.is_map(kind):
        return "{" + ", ".join(f"{_member(entry['key'])}={_member(entry['value'])}" for entry in scalar.values) + "}"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return "[" + ", ".join(_member(item) for item in scalar.values) + "]"
    if pa.types.is_struct(kind):
        return "{" + ", ".join(f"{name!r}: {_member(field)}" for name, field in scalar.items()) + "}"
    return _python(scalar.as_py())


def outcome_of(table: pa.Table) -> Outcome:
    """A successful query's outcome: its column names and its rows rendered."""
    columns = [[render(scalar) for scalar in column] for column in table.columns]
    return Outcome(None, tuple(table.column_names), tuple("\t".join(row) for row in zip(*columns)))


def run_on_duckdb(con: duckdb.DuckDBPyConnection, record: Record) -> Outcome:
    """Run a record on an in-process DuckDB connection (a query's result taken as Arrow)."""
    try:
        if record.is_query:
            return outcome_of(con.sql(record.sql).to_arrow_table())
        con.execute(record.sql)
    except duckdb.Error as error:
        return Outcome(str(error))
    return Outcome(None)


def run_on_quail(cursor: flight_sql.Cursor, record: Record) -> Outcome:
    """Run a record through an ADBC Flight SQL cursor; a statement's result is read to its end too (a server
    may report an error in the stream), then dropped."""
    try:
        cursor.execute(record.sql)
        table = cursor.fetch_arrow_table()
    except (flight_sql.Error, pa.ArrowException) as error:
        return Outcome(str(error))
    return outcome_of(table) if record.is_query else Outcome(None)


def misses(record: Record, outcome: Outcome) -> list[str]:
    """How an outcome falls short of the record's expectation (empty: it meets it)."""
    if record.error is not None:
        if outcome.error is None:
            return ["succeeded where an error was expected"]
        return [] if record.error in outcome.error else [f"the error does not mention {record.error!r}"]
    if outcome.error is not None:
        return ["an error where success was expected"]
    if not record.is_query:
        return []
    problems, expected = [], list(record.expected)
    if len(outcome.names) != record.columns:
        problems.append(f"{len(outcome.names)} columns, not {record.columns}")
    if record.colnames:
        names = expected.pop(0).split("\t") if expected else []
        if list(outcome.names) != names:
            problems.append(f"column names {list(outcome.names)}, not {names}")
    if _ordered(record, list(outcome.rows)) != _ordered(record, expected):
        problems.append("rows differ from the expected rows")
    return problems


def _ordered(record: Record, rows: list[str]) -> list[str]:
    """Rows as a record compares them: sorted under `rowsort`, else as they came."""
    return sorted(rows) if record.rowsort else rows


def disagreements(record: Record, ours: Outcome, theirs: Outcome) -> list[str]:
    """Where DuckDB's and Quail's outcomes of a record differ: one failing alone, other column names, other
    rows (error messages themselves may differ)."""
    if (ours.error is None) != (theirs.error is None):
        return ["only " + ("Quail" if ours.error is None else "DuckDB") + " failed"]
    problems = []
    if ours.names != theirs.names:
        problems.append(NAMES_DIFFER)
    if _ordered(record, list(ours.rows)) != _ordered(record, list(theirs.rows)):
        problems.append("the rows differ")
    return problems


def problems_of(record: Record, ours: Outcome, theirs: Outcome) -> list[str]:
    """Why a record fails side by side: an engine missing the file's expectation, or the two disagreeing. Where
    an engine misses it, only differing column names are added (the rest of a disagreement follows from it and
    shows in the outcomes); where both meet it, they can differ only in column names."""
    missed = ([f"DuckDB: {problem}" for problem in misses(record, ours)]
              + [f"Quail: {problem}" for problem in misses(record, theirs)])
    differ = disagreements(record, ours, theirs)
    return missed + [problem for problem in differ if problem == NAMES_DIFFER or not missed]


def report(record: Record, problems: list[str], outcomes: dict[str, Outcome]) -> str:
    """A failed record: where, its SQL, what went wrong, the expectation and each engine's outcome."""
    sql = "\n    ".join(record.sql.splitlines())
    expected = ("an error" + (f" mentioning {record.error!r}" if record.error else "")
                if record.error is not None else "\n      ".join(record.expected) or "success")
    lines = [f"{record.where()}: {'; '.join(problems)}", f"    {sql}", f"  expected: {expected}"]
    lines += [f"  {name}: {outcome.describe()}" for name, outcome in outcomes.items()]
    return "\n".join(lines)


@pytest.fixture
def quail(server) -> Iterator[flight_sql.Cursor]:
    """A cursor of one ADBC connection to the module's server, in a session of the duckdb dialect."""
    with flight_sql.connect(server.uri, db_kwargs=COOKIES, autocommit=True) as conn:
        set_session_options(conn, dialect="duckdb")
        with conn.cursor() as cursor:
            yield cursor


@pytest.mark.parametrize("path", SLT_FILES, ids=lambda path: path.stem)
def test_file_on_duckdb(path: Path) -> None:
    """Every record of the file gives, on DuckDB alone, what the file expects."""
    failures = []
    with duckdb.connect() as con:
        for record in parse(path):
            outcome = run_on_duckdb(con, record)
            if problems := misses(record, outcome):
                failures.append(report(record, problems, {"duckdb": outcome}))
    assert not failures, f"{len(failures)} records failed on DuckDB:\n" + "\n\n".join(failures)


@pytest.mark.parametrize("path", SLT_FILES, ids=lambda path: path.stem)
def test_file_on_quail(path: Path, quail: flight_sql.Cursor) -> None:
    """Every record of the file gives, on DuckDB and on Quail, what the file expects, and the same outcome."""
    failures = []
    with duckdb.connect() as con:
        for record in parse(path):
            ours, theirs = run_on_duckdb(con, record), run_on_quail(quail, record)
            if problems := problems_of(record, ours, theirs):
                failures.append(report(record, problems, {"duckdb": ours, "quail": theirs}))
    assert not failures, f"{len(failures)} records failed:\n" + "\n\n".join(failures)
