"""Arrow data as the database can store it: converted where nothing is lost, else refused with its column named.

- A half float becomes a float (every half value is one).
- A decimal256 of at most 38 digits becomes a decimal128 (DuckDB's widest decimal); a wider one is refused.
- Unions are refused: DuckDB stores no Arrow union.
- Durations in nanoseconds and month-day-nano intervals are kept to the microsecond (DuckDB's INTERVAL):
  a value with a finer part is refused, not rounded.
- A column with no name is refused.
Lists, structs, maps, dictionaries and run-end encoded columns are converted and checked inside.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from quail.engine.errors import InvalidArgument

MAX_DECIMAL_DIGITS = 38
_LISTS = ((pa.types.is_list, pa.list_), (pa.types.is_large_list, pa.large_list),
          (pa.types.is_list_view, pa.list_view), (pa.types.is_large_list_view, pa.large_list_view))
_MONTH_DAY_NANO = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanoseconds", "<i8")])


def storable(table: pa.Table) -> pa.Table:
    """The table with each column in a type the database stores exactly (InvalidArgument when one cannot be)."""
    for index, name in enumerate(table.schema.names):
        if not name:
            raise InvalidArgument(f"column {index + 1} of the data has no name: every column needs one")
    target = pa.schema([f.with_type(_stored_type(f.type, f.name)) for f in table.schema], metadata=table.schema.metadata)
    for field, column in zip(table.schema, table.columns):
        for chunk in column.chunks:
            _check_microseconds(chunk, field.name)
    return table if target.equals(table.schema, check_metadata=True) else table.cast(target)


def _stored_type(kind: pa.DataType, column: str) -> pa.DataType:
    """The type a column of `kind` is stored as."""
    if pa.types.is_float16(kind):
        return pa.float32()
    if pa.types.is_decimal256(kind):
        if kind.precision > MAX_DECIMAL_DIGITS:
            raise InvalidArgument(f"column {column!r} is {kind}: the database keeps decimals of at most "
                                  f"{MAX_DECIMAL_DIGITS} digits")
        return pa.decimal128(kind.precision, kind.scale)
    if pa.types.is_union(kind):
        raise InvalidArgument(f"column {column!r} is a {kind}: the database stores no union; send each of its "
                              f"types as a column of its own")
    if pa.types.is_struct(kind):
        return pa.struct([_inner(kind.field(i), column) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(_inner(kind.key_field, column), _inner(kind.item_field, column), kind.keys_sorted)
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(_inner(kind.value_field, column), kind.list_size)
    for is_list, make in _LISTS:
        if is_list(kind):
            return make(_inner(kind.value_field, column))
    if pa.types.is_dictionary(kind):
        return pa.dictionary(kind.index_type, _stored_type(kind.value_type, column), kind.ordered)
    if pa.types.is_run_end_encoded(kind):
        return pa.run_end_encoded(kind.run_end_type, _stored_type(kind.value_type, column))
    return kind


def _inner(field: pa.Field, column: str) -> pa.Field:
    return field.with_type(_stored_type(field.type, f"{column}.{field.name}"))


def _check_microseconds(array: pa.Array, column: str) -> None:
    """InvalidArgument when a nanosecond duration or a month-day-nano interval in the array (nested ones too)
    has a part finer than a microsecond."""
    kind = array.type
    if pa.types.is_duration(kind) and kind.unit == "ns":
        finer = bool(np.any(array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False) % 1000))
    elif kind == pa.month_day_nano_interval():
        values = np.frombuffer(array.buffers()[1], _MONTH_DAY_NANO)[array.offset:array.offset + len(array)]
        valid = np.asarray(array.is_valid())
        finer = bool(np.any(values["nanoseconds"][valid] % 1000))
    else:
        for child in _children(array):
            _check_microseconds(child, column)
        return
    if finer:
        raise InvalidArgument(f"column {column!r} ({kind}) holds a value finer than a microsecond: the database "
                              f"keeps intervals to the microsecond")


def _children(array: pa.Array) -> list[pa.Array]:
    """The arrays nested in a list, struct, map, dictionary or run-end encoded array."""
    kind = array.type
    if pa.types.is_struct(kind):
        return [array.field(i) for i in range(kind.num_fields)]
    if pa.types.is_map(kind):
        return [array.keys, array.items]
    if pa.types.is_fixed_size_list(kind) or pa.types.is_run_end_encoded(kind) or any(
            is_list(kind) for is_list, _ in _LISTS):
        return [array.values]
    if pa.types.is_dictionary(kind):
        return [array.dictionary]
    return []
