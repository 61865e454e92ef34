"""Binding a syntax tree to the catalog (table names) and to parameter values."""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
from sqlglot import exp

from quail.engine.errors import InvalidArgument, NotFound
from quail.engine.exec.catalog import RESERVED, Catalog

from quail.planner.dialects import position

UNBOUND = "quail_unbound_parameter"
CATALOG_NAME = "quail"
SCHEMA_NAME = "main"


def bind_tables(tree: exp.Expression, catalog: Catalog) -> tuple[str, ...]:
    """Check every table the statement reads exists; strip `quail.main.` qualifiers in place.

    Returns the stored tables read, lower-cased, in first-use order. Names of
    CTEs are not tables.
    """
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tables: list[str] = []
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            raise InvalidArgument(f"table functions are not supported{position(table)}")
        name = table.name
        catalog_name, schema_name = table.catalog, table.db
        if not catalog_name and not schema_name and name.lower() in ctes:
            continue
        if (catalog_name and catalog_name.lower() != CATALOG_NAME) or (schema_name and schema_name.lower() != SCHEMA_NAME):
            raise NotFound(f"schema {'.'.join(p for p in (catalog_name, schema_name) if p)!r} does not exist{position(table)}")
        if not catalog.has(name):
            raise NotFound(f"table {name!r} does not exist{position(table)}")
        table.set("catalog", None)
        table.set("db", None)
        if name.lower() not in tables:
            tables.append(name.lower())
    return tuple(tables)


def refuse_reserved(tree: exp.Expression) -> None:
    """InvalidArgument for a name the statement gives or reads that starts with RESERVED: a plan's own relations
    and columns are named so, and a user's name could stand for one of them."""
    for identifier in tree.find_all(exp.Identifier):
        if identifier.name.lower().startswith(RESERVED):
            raise InvalidArgument(f"the name {identifier.name!r} is reserved: names starting with {RESERVED} are "
                                  f"Quail's own{position(identifier)}")


def bind_parameters(tree: exp.Expression, values: Sequence[Any] | None) -> int:
    """Replace `?` placeholders, in order, by typed literals of the values (`unbound()` when values is None).

    A value is a Python value or a `pyarrow.Scalar` (as a client's parameter batch
    holds it); either way the literal has the value's Arrow type, so DuckDB sees
    exactly what was bound (NaN stays NaN, a decimal keeps its scale).
    Returns how many placeholders the statement had.
    """
    holders = list(tree.find_all(exp.Placeholder))
    holders.sort(key=lambda p: (p.meta.get("line", 0), p.meta.get("col", 0)))
    if values is not None and len(values) != len(holders):
        raise InvalidArgument(f"the statement has {len(holders)} parameter(s), {len(values)} value(s) were bound")
    for i, holder in enumerate(holders):
        holder.replace(unbound() if values is None else typed_literal(values[i]))
    return len(holders)


def python_values(values: Sequence[Any]) -> tuple:
    """Parameter values as DuckDB binds them from Python: a `pyarrow.Scalar` as its Python value (a union's, the
    value it holds; a map's, a dict), anything else as it is."""
    return tuple(_python(value) for value in values)


def _python(value: Any) -> Any:
    if not isinstance(value, pa.Scalar):
        return value
    if pa.types.is_union(value.type):
        return _python(value.value) if value.is_valid else None
    try:
        return value.as_py(maps_as_pydicts="strict")
    except (KeyError, ValueError) as err:
        raise InvalidArgument(f"a parameter of type {value.type} cannot be bound: {err}") from None


def unbound() -> exp.Null:
    """The NULL standing for a parameter not bound yet (a statement prepared, planned for its schema)."""
    null = exp.null()
    null.meta[UNBOUND] = True
    return null


def is_unbound(node: exp.Expression) -> bool:
    return isinstance(node, exp.Null) and node.meta.get(UNBOUND, False)


_INTEGERS = {8: "TINYINT", 16: "SMALLINT", 32: "INTEGER", 64: "BIGINT"}
_NANOS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def is_text(kind: pa.DataType) -> bool:
    """Whether a column of this type holds text: a string, a large string or a string view."""
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def typed_literal(value: Any) -> exp.Expression:
    """A SQL expression DuckDB evaluates to exactly the value, typed as its Arrow type."""
    scalar = value if isinstance(value, pa.Scalar) else _scalar(value)
    if pa.types.is_union(scalar.type):  # a client sending each parameter as a union of types: the one it holds
        return typed_literal(scalar.value) if scalar.is_valid else exp.null()
    kind = scalar.type
    if not scalar.is_valid:
        return exp.null() if pa.types.is_null(kind) else exp.cast(exp.null(), _sql_type(kind))
    if is_text(kind):
        return exp.Literal.string(scalar.as_py())
    if pa.types.is_boolean(kind):
        return exp.Boolean(this=scalar.as_py())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return exp.Anonymous(this="from_hex", expressions=[exp.Literal.string(scalar.as_py().hex())])
    if pa.types.is_duration(kind):
        nanos = scalar.value * _NANOS[kind.unit]
        if nanos % 1000:
            raise InvalidArgument(f"a duration of {nanos} ns cannot be bound: SQL intervals hold whole microseconds")
        micros = nanos // 1000
        return exp.Anonymous(this="to_microseconds", expressions=[exp.cast(exp.Literal.number(micros), "BIGINT")])
    if pa.types.is_floating(kind):
        text = repr(float(scalar.as_py()))
    elif pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_time(kind):
        text = pa.compute.cast(scalar, pa.string()).as_py()
    elif pa.types.is_decimal(kind):
        text = format(scalar.as_py(), "f")  # fixed point: DuckDB's DECIMAL reads no exponent
    else:
        text = str(scalar.as_py())
    return exp.cast(exp.Literal.string(text), _sql_type(kind))


def _scalar(value: Any) -> pa.Scalar:
    try:
        return pa.scalar(value)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
        raise InvalidArgument(f"a parameter of Python type {type(value).__name__} cannot be bound: {err}") from None


def _sql_type(kind: pa.DataType) -> exp.DataType:
    """DuckDB's type for an Arrow type of a bound parameter; InvalidArgument for nested and other types."""
    if pa.types.is_integer(kind):
        name = _INTEGERS[kind.bit_width]
        text = name if pa.types.is_signed_integer(kind) else f"U{name}"
    elif pa.types.is_floating(kind):
        text = "DOUBLE" if kind.bit_width == 64 else "FLOAT"
    elif pa.types.is_decimal(kind) and kind.precision <= 38:
        text = f"DECIMAL({kind.precision}, {kind.scale})"
    elif pa.types.is_timestamp(kind):
        text = "TIMESTAMPTZ" if kind.tz else {"s": "TIMESTAMP_S", "ms": "TIMESTAMP_MS", "us": "TIMESTAMP",
                                               "ns": "TIMESTAMP_NS"}[kind.unit]
    elif pa.types.is_date(kind):
        text = "DATE"
    elif pa.types.is_time(kind):
        text = "TIME"
    elif is_text(kind):
        text = "VARCHAR"
    elif pa.types.is_boolean(kind):
        text = "BOOLEAN"
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        text = "BLOB"
    elif pa.types.is_duration(kind):
        text = "INTERVAL"
    else:
        raise InvalidArgument(f"parameters of type {kind} are not supported: bind a scalar value")
    return exp.DataType.build(text, dialect="duckdb")
