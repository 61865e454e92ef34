"""Substrait types: from Arrow and SQL types, back to DuckDB's, and the common type of two values."""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp
from substrait.type_pb2 import NamedStruct, Type

from quail.engine.errors import Unimplemented

DType = exp.DataType.Type
STRINGS = ("string", "varchar", "fixed_char")
INTEGERS = ("i8", "i16", "i32", "i64")
_DIGITS = {"i8": 3, "i16": 5, "i32": 10, "i64": 19}  # the decimal precision that holds each integer
_WIDER = (*INTEGERS, "decimal", "fp32", "fp64")  # numeric kinds, narrower first
_TIMESTAMP_UNITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_FROM_SQL = {
    DType.BOOLEAN: "bool", DType.TINYINT: "i8", DType.SMALLINT: "i16", DType.INT: "i32", DType.BIGINT: "i64",
    DType.FLOAT: "fp32", DType.DOUBLE: "fp64", DType.TEXT: "string", DType.VARCHAR: "string", DType.CHAR: "string",
    DType.NVARCHAR: "string", DType.VARBINARY: "binary", DType.BINARY: "binary", DType.DATE: "date",
}
_TIMESTAMPS_FROM_SQL = {DType.TIMESTAMP: 6, DType.TIMESTAMPNTZ: 6, DType.TIMESTAMP_S: 0, DType.TIMESTAMP_MS: 3,
                        DType.TIMESTAMP_NS: 9}
_TO_SQL = {"bool": "BOOLEAN", "i8": "TINYINT", "i16": "SMALLINT", "i32": "INTEGER", "i64": "BIGINT", "fp32": "REAL",
           "fp64": "DOUBLE", "string": "VARCHAR", "varchar": "VARCHAR", "fixed_char": "VARCHAR", "binary": "BLOB",
           "fixed_binary": "BLOB", "date": "DATE", "precision_timestamp_tz": "TIMESTAMPTZ"}
_TIMESTAMPS_TO_SQL = {0: "TIMESTAMP_S", 3: "TIMESTAMP_MS", 6: "TIMESTAMP", 9: "TIMESTAMP_NS"}


def of(kind: str, nullable: bool = True, **params: int) -> Type:
    """A type by its Substrait kind ("i64", "decimal", ...) and parameters (precision, scale)."""
    result = Type()
    body = getattr(result, kind)
    body.nullability = Type.NULLABILITY_NULLABLE if nullable else Type.NULLABILITY_REQUIRED
    for name, value in params.items():
        setattr(body, name, value)
    return result


def list_of(element: Type) -> Type:
    result = of("list", nullable=False)
    result.list.type.CopyFrom(element)
    return result


def kind(type_: Type) -> str:
    return type_.WhichOneof("kind") or ""


def same(a: Type, b: Type) -> bool:
    """Whether two types are equal but for nullability."""
    return _key(a) == _key(b)


def _key(type_: Type) -> tuple:
    body = getattr(type_, kind(type_), None)
    if body is None:
        return ("",)
    fields = tuple((f.name, _key(v) if isinstance(v, Type) else v) for f, v in body.ListFields()
                   if f.name not in ("nullability", "type_variation_reference"))
    return (kind(type_), fields)


def describe(type_: Type) -> str:
    """A type as error messages name it: its DuckDB name, else its Substrait kind."""
    try:
        return to_sql(type_).sql("duckdb")
    except Unimplemented:
        return kind(type_) or "(no type)"


def from_arrow(type_: pa.DataType) -> Type:
    """The Substrait type of an Arrow column type; Unimplemented for types without one here."""
    checks = [(pa.types.is_boolean, "bool"), (pa.types.is_int8, "i8"), (pa.types.is_int16, "i16"),
              (pa.types.is_int32, "i32"), (pa.types.is_int64, "i64"), (pa.types.is_float32, "fp32"),
              (pa.types.is_float64, "fp64"), (pa.types.is_string, "string"), (pa.types.is_large_string, "string"),
              (pa.types.is_binary, "binary"), (pa.types.is_large_binary, "binary"), (pa.types.is_date, "date")]
    for check, name in checks:
        if check(type_):
            return of(name)
    if pa.types.is_decimal(type_) and type_.precision <= 38:
        return of("decimal", precision=type_.precision, scale=type_.scale)
    if pa.types.is_timestamp(type_):
        name = "precision_timestamp_tz" if type_.tz else "precision_timestamp"
        return of(name, precision=_TIMESTAMP_UNITS[type_.unit])
    raise Unimplemented(f"Substrait export: columns of Arrow type {type_} are not supported")


def named_struct(schema: pa.Schema) -> NamedStruct:
    """A table's schema as a ReadRel's base_schema."""
    struct = Type.Struct(types=[from_arrow(f.type) for f in schema], nullability=Type.NULLABILITY_REQUIRED)
    return NamedStruct(names=schema.names, struct=struct)


def from_sql(type_: exp.DataType) -> Type:
    """The Substrait type of a SQL (DuckDB) type of a CAST."""
    if type_.this in _FROM_SQL:
        return of(_FROM_SQL[type_.this])
    if type_.this in _TIMESTAMPS_FROM_SQL:
        return of("precision_timestamp", precision=_TIMESTAMPS_FROM_SQL[type_.this])
    if type_.this == DType.TIMESTAMPTZ:
        return of("precision_timestamp_tz", precision=6)
    if type_.this == DType.DECIMAL:
        precision, scale = (int(e.name) for e in type_.expressions) if type_.expressions else (18, 3)
        return of("decimal", precision=precision, scale=scale)
    raise Unimplemented(f"Substrait export: the SQL type {type_.sql('duckdb')} is not supported")


def to_sql(type_: Type) -> exp.DataType:
    """The DuckDB type of a Substrait type; Unimplemented for types without one here."""
    name = kind(type_)
    if name == "decimal":
        text = f"DECIMAL({type_.decimal.precision}, {type_.decimal.scale})"
    elif name == "precision_timestamp" and type_.precision_timestamp.precision in _TIMESTAMPS_TO_SQL:
        text = _TIMESTAMPS_TO_SQL[type_.precision_timestamp.precision]
    elif name in _TO_SQL:
        text = _TO_SQL[name]
    else:
        raise Unimplemented(f"Substrait import: values of the Substrait type {name or '(none)'} are not supported")
    return exp.DataType.build(text, dialect="duckdb")


def common(a: Type, b: Type) -> Type | None:
    """The type two values meet at (DuckDB's implicit casts among numbers), or None."""
    if same(a, b):
        return of(kind(a), **_params(a))
    ka, kb = kind(a), kind(b)
    if ka not in _WIDER or kb not in _WIDER:
        return None
    wider = max(ka, kb, key=_WIDER.index)
    if wider != "decimal":
        return of(wider)
    (pa_, sa), (pb, sb) = _decimal(a), _decimal(b)
    scale = max(sa, sb)
    return of("decimal", precision=min(38, max(pa_ - sa, pb - sb) + scale), scale=scale)


def _params(type_: Type) -> dict[str, int]:
    body = getattr(type_, kind(type_))
    return {f.name: v for f, v in body.ListFields() if f.name in ("precision", "scale")}


def _decimal(type_: Type) -> tuple[int, int]:
    """(precision, scale) of a decimal or integer type."""
    if kind(type_) == "decimal":
        return type_.decimal.precision, type_.decimal.scale
    return _DIGITS[kind(type_)], 0
