"""Statements that only pick rows and columns of one relation, taken in Arrow as DuckDB would answer them.

A `Picks` keeps the rows its condition holds for, then takes its items: a
column (perhaps renamed), all columns, the row number, a column as text.
Each part says what it makes of a relation, or None where DuckDB might answer
otherwise (a name that is no one column's, a type DuckDB would change, a value
DuckDB would compare another way): the executor then runs the statement in
DuckDB, which also gives every error.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import ClassVar, Mapping, Protocol, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Columns = list[tuple[pa.Field, pa.ChunkedArray]]


def _kept_by_duckdb(t: pa.DataType) -> bool:
    """Whether DuckDB returns a column of this type as it is (a large string, a string view or a dictionary
    comes back a string, a list's item is renamed, a time zone is spelled another way)."""
    return (pa.types.is_boolean(t) or pa.types.is_integer(t) or t in (pa.float32(), pa.float64(), pa.string(),
            pa.binary(), pa.date32(), pa.null()) or pa.types.is_decimal128(t)
            or pa.types.is_timestamp(t) and t.tz is None)


class _Named:
    """A relation's columns by name, as DuckDB finds them: whatever the case."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        self._by_name: dict[str, list[int]] = {}
        for i, name in enumerate(rows.schema.names):
            self._by_name.setdefault(name.lower(), []).append(i)

    def find(self, name: str) -> tuple[pa.Field, pa.ChunkedArray] | None:
        """The one column of that name (None: none or several)."""
        found = self._by_name.get(name.lower(), [])
        return (self.rows.schema.field(found[0]), self.rows.column(found[0])) if len(found) == 1 else None


class Item(Protocol):
    """One part of a statement's select list; ROW_BY_ROW: each of its values comes from its row alone."""

    ROW_BY_ROW: ClassVar[bool]

    def take(self, named: _Named) -> Columns | None: ...


@dataclass(frozen=True)
class Column:
    """A column, under its stored name unless `alias` (`SELECT r.body AS text`)."""

    ROW_BY_ROW: ClassVar[bool] = True

    name: str
    alias: str | None = None

    def take(self, named: _Named) -> Columns | None:
        found = named.find(self.name)
        if found is None or not _kept_by_duckdb(found[0].type):
            return None
        field, values = found
        return [(pa.field(self.alias if self.alias is not None else field.name, field.type), values)]


@dataclass(frozen=True)
class AllColumns:
    """Every column under its stored name (`SELECT r.*`).

    Not where two names differ only in case (DuckDB
    renames the second)."""

    ROW_BY_ROW: ClassVar[bool] = True

    def take(self, named: _Named) -> Columns | None:
        schema = named.rows.schema
        if not all(_kept_by_duckdb(field.type) for field in schema) or \
                len({name.lower() for name in schema.names}) < len(schema.names):
            return None
        return [(pa.field(field.name, field.type), named.rows.column(i)) for i, field in enumerate(schema)]


@dataclass(frozen=True)
class RowNumber:
    """The rows' numbers from 1, in the relation's order (`ROW_NUMBER() OVER () AS alias`)."""

    ROW_BY_ROW: ClassVar[bool] = False

    alias: str

    def take(self, named: _Named) -> Columns | None:
        numbers = pa.chunked_array([np.arange(1, named.rows.num_rows + 1, dtype=np.int64)], pa.int64())
        return [(pa.field(self.alias, pa.int64()), numbers)]


@dataclass(frozen=True)
class AsText:
    """A string, integer or boolean column as DuckDB writes it as text (`CAST(r.body AS TEXT) AS alias`)."""

    ROW_BY_ROW: ClassVar[bool] = True

    name: str
    alias: str

    def take(self, named: _Named) -> Columns | None:
        found = named.find(self.name)
        if found is None:
            return None
        t = found[0].type
        if t != pa.string() and not pa.types.is_integer(t) and not pa.types.is_boolean(t):
            return None
        return [(pa.field(self.alias, pa.string()), found[1].cast(pa.string()))]


class Condition(Protocol):
    """A WHERE condition: which rows it is true, false or unknown (NULL) for."""

    def mask(self, named: _Named) -> pa.ChunkedArray | None: ...


Value = Union[int, str]

_COMPARE = {"=": pc.equal, "<>": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
            ">=": pc.greater_equal}


def _scalar(field: pa.Field, value: Value) -> pa.Scalar | None:
    """The value as a scalar that Arrow compares with the column as DuckDB would: an integer with an
    integer column (not an unsigned 64-bit one), a string with a string column; None for any other pair."""
    t = field.type
    if isinstance(value, str):
        return pa.scalar(value, pa.string()) if t == pa.string() else None
    if pa.types.is_integer(t) and t != pa.uint64() and -2 ** 63 <= value < 2 ** 63:
        return pa.scalar(value, pa.int64())
    return None


@dataclass(frozen=True)
class Compare:
    """`column <op> value`, op one of = <> < <= > >=."""

    column: str
    op: str
    value: Value

    def mask(self, named: _Named) -> pa.ChunkedArray | None:
        found = named.find(self.column)
        scalar = _scalar(found[0], self.value) if found is not None else None
        return _COMPARE[self.op](found[1], scalar) if scalar is not None else None


@dataclass(frozen=True)
class IsNull:
    """`column IS NULL`."""

    column: str

    def mask(self, named: _Named) -> pa.ChunkedArray | None:
        found = named.find(self.column)
        return pc.is_null(found[1]) if found is not None else None


@dataclass(frozen=True)
class Not:
    """A condition negated."""

    term: Condition

    def mask(self, named: _Named) -> pa.ChunkedArray | None:
        inner = self.term.mask(named)
        return pc.invert(inner) if inner is not None else None


@dataclass(frozen=True)
class AllOf:
    """Every term true (AND, NULL as SQL has it)."""

    terms: tuple[Condition, ...]

    def mask(self, named: _Named) -> pa.ChunkedArray | None:
        return _combined(self.terms, named, pc.and_kleene)


@dataclass(frozen=True)
class AnyOf:
    """Some term true (OR, NULL as SQL has it)."""

    terms: tuple[Condition, ...]

    def mask(self, named: _Named) -> pa.ChunkedArray | None:
        return _combined(self.terms, named, pc.or_kleene)


def _combined(terms: tuple[Condition, ...], named: _Named, how) -> pa.ChunkedArray | None:
    masks = [term.mask(named) for term in terms]
    return None if any(m is None for m in masks) else reduce(how, masks)


@dataclass(frozen=True)
class Picks:
    """What a statement that only picks from one relation does.

    (`SELECT r.*, b AS c FROM src AS r WHERE ...`):
    the rows of `source` that `where` holds for (None: all), then `items` in order."""

    source: str
    items: tuple[Item, ...]
    where: Condition | None = None

    def row_by_row(self) -> bool:
        """Whether each output row comes from one row of the source alone (no row numbers)."""
        return all(item.ROW_BY_ROW for item in self.items)

    def take(self, relations: Mapping[str, pa.Table]) -> pa.Table | None:
        """The statement's output as DuckDB returns it (names as written or stored, nullable fields, no
        metadata); None where DuckDB might answer otherwise: DuckDB runs the statement then."""
        rows = _relation(relations, self.source)
        if rows is None:
            return None
        if self.where is not None:
            mask = self.where.mask(_Named(rows))
            if mask is None:
                return None
            rows = rows.filter(mask)
        named, columns = _Named(rows), []
        for item in self.items:
            taken = item.take(named)
            if taken is None:
                return None
            columns += taken
        return pa.Table.from_arrays([values for _, values in columns], schema=pa.schema([f for f, _ in columns]))


def _relation(relations: Mapping[str, pa.Table], name: str) -> pa.Table | None:
    """The relation of that name, whatever the case (None: none, or several)."""
    if name in relations:
        return relations[name]
    found = [table for key, table in relations.items() if key.lower() == name.lower()]
    return found[0] if len(found) == 1 else None
