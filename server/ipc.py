"""Arrow IPC messages to and from Flight's FlightData (header = flatbuffer Message, body = buffers)."""

from __future__ import annotations

import struct
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

from quail.server.flight_messages import FLIGHT

_CONTINUATION = b"\xff\xff\xff\xff"
_END_OF_STREAM = _CONTINUATION + b"\x00\x00\x00\x00"


def schema_bytes(schema: pa.Schema) -> bytes:
    """A schema as an encapsulated IPC message (FlightInfo.schema, SchemaResult, prepared statements)."""
    return schema.serialize().to_pybytes()


def _plain(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Dictionary columns decoded, so every batch stands alone as one IPC message."""
    if not any(pa.types.is_dictionary(f.type) for f in batch.schema):
        return batch
    columns = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


MAX_BATCH_BYTES = 8 << 20  # a listing's batch, at most (clients refuse messages past 16 MiB by default)


def bounded_batches(table: pa.Table, max_bytes: int = MAX_BATCH_BYTES) -> list[pa.RecordBatch]:
    """The table's rows in batches of at most `max_bytes` each (a single row larger stays whole): each batch
    is one Flight message, so a listing of many tables never passes a client's message limit."""
    pending, done = list(reversed(table.to_batches())), []
    while pending:
        batch = pending.pop()
        if batch.nbytes <= max_bytes or batch.num_rows <= 1:
            done.append(batch)
        else:
            half = batch.num_rows // 2
            pending += [batch.slice(half), batch.slice(0, half)]
    return done


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """The schema `encode` sends for data of this schema (dictionaries decoded)."""
    return pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema],
                     metadata=schema.metadata)


def _flight_data(message: ipc.Message, **extra) -> bytes:
    data = FLIGHT["FlightData"](data_header=message.metadata.to_pybytes(), data_body=message.body.to_pybytes()
                                if message.body is not None else b"", **extra)
    return data.SerializeToString()


def encode(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    """Serialized FlightData messages: the schema, then one per batch."""
    yield _flight_data(ipc.read_message(schema_bytes(plain_schema(schema))))
    for batch in batches:
        if batch.num_rows:
            yield _flight_data(ipc.read_message(_plain(batch).serialize()))


def _encapsulate(header: bytes, body: bytes) -> bytes:
    padding = -len(header) % 8
    return _CONTINUATION + struct.pack("<i", len(header) + padding) + header + b"\x00" * padding + body


def first_schema(data) -> pa.Schema | None:
    """The schema a stream's first FlightData carries (None: it carries none)."""
    if not data.data_header:
        return None
    try:
        return ipc.read_schema(pa.py_buffer(_encapsulate(data.data_header, data.data_body)))
    except (pa.ArrowException, ValueError):
        return None


def decode(messages: Iterable) -> tuple[pa.Schema, list[pa.RecordBatch], list[bytes]]:
    """Schema, batches and app_metadata payloads of a stream of parsed FlightData messages
    (no Arrow data at all: an empty schema)."""
    chunks: list[bytes] = []
    metadata: list[bytes] = []
    for data in messages:
        if data.data_header:
            chunks.append(_encapsulate(data.data_header, data.data_body))
        if data.app_metadata:
            metadata.append(data.app_metadata)
    if not chunks:  # a DoPut of a statement update carries its descriptor only
        return pa.schema([]), [], metadata
    reader = ipc.open_stream(pa.py_buffer(b"".join(chunks) + _END_OF_STREAM))
    return reader.schema, list(reader), metadata
