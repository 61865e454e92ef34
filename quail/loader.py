"""`quail load`: a CSV, Parquet, JSON lines or Arrow file read on the client and ingested into a table over ADBC.

- The file is read a batch at a time and sent as it is read; nothing reads it on the server (whose file
  access is off). Files larger than memory load: Parquet and Arrow by their batches, CSV and JSON lines by
  pieces of whole lines (about BLOCK_BYTES each) read only when the ingest asks for more, each parsed as
  the first piece's schema says (a later value that does not fit it is a clear error, and nothing loads).
- Modes: create (the table must not exist), append, replace.
- Progress (the share of the file read, and the rows sent) goes to `progress`, a row count at the end.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.csv as csv
import pyarrow.ipc as ipc
import pyarrow.json as json
import pyarrow.parquet as pq

FORMATS = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "json",
           ".ndjson": "json", ".json": "json", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow"}
MODES = ("create", "append", "replace")
BATCH_ROWS = 65_536  # rows a Parquet batch holds at most (CSV and JSON batches are their readers' blocks)
BLOCK_BYTES = 8 << 20  # bytes of text a CSV or JSON piece is read from


def _line_end(text: bytes, quoted: bool) -> int:
    """Where the last whole line of `text` ends (0: none); for CSV, a line end outside quotes (`text` starts
    outside them: a quote char toggles, and an escaped one, doubled, toggles twice).

    >>> _line_end(b'1,"a\\nb"\\n2,c', True), _line_end(b'1,"a\\nb', True), _line_end(b'{"a": 1}\\n{"a"', False)
    (8, 0, 9)
    """
    end = text.rfind(b"\n")
    while quoted and end >= 0 and text.count(b'"', 0, end) % 2:
        end = text.rfind(b"\n", 0, end)
    return end + 1


def _pieces(path: Path, quoted: bool, done: list[int]) -> Iterator[bytes]:
    """The file's bytes in pieces of whole lines, about BLOCK_BYTES each, read as they are asked for
    (`done[0]`: the bytes handed out so far)."""
    with open(path, "rb") as source:
        carried = b""
        while block := source.read(BLOCK_BYTES):
            carried += block
            end = _line_end(carried, quoted)
            if end:
                piece, carried = carried[:end], carried[end:]
                done[0] += len(piece)
                yield piece
        if carried:
            done[0] += len(carried)
            yield carried


def _text_batches(path: Path, fmt: str) -> tuple[pa.Schema, Iterator[pa.RecordBatch], Callable[[], float]]:
    """A CSV or JSON lines file's batches, a piece of its text parsed at a time as they are asked for: the
    first piece gives the schema (its header: CSV's column names), every later one is read as that."""
    done, size = [0], max(path.stat().st_size, 1)
    pieces = _pieces(path, fmt == "csv", done)
    first = next(pieces, b"")
    parse = csv.ParseOptions(delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
    table = csv.read_csv(io.BytesIO(first), parse_options=parse) if fmt == "csv" else json.read_json(io.BytesIO(first))
    schema = table.schema

    def read(piece: bytes) -> pa.Table:
        if fmt == "csv":
            return csv.read_csv(io.BytesIO(piece), read_options=csv.ReadOptions(column_names=schema.names),
                                parse_options=parse, convert_options=csv.ConvertOptions(column_types=schema))
        return json.read_json(io.BytesIO(piece), parse_options=json.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="error"))

    def every() -> Iterator[pa.RecordBatch]:
        yield from table.to_batches()
        for piece in pieces:
            yield from read(piece).to_batches()
    return schema, every(), lambda: done[0] / size


def file_format(path: Path, given: str | None = None) -> str:
    """The file's format: `given`, else by its extension; ValueError when neither says."""
    found = given or FORMATS.get(path.suffix.lower())
    if found not in set(FORMATS.values()):
        raise ValueError(f"cannot tell the format of {path.name}: give --format csv, parquet, json or arrow")
    return found


def batches(path: Path, fmt: str) -> tuple[pa.Schema, Iterator[pa.RecordBatch], Callable[[], float]]:
    """The file's schema, its batches as they are read, and the share of the file read so far."""
    if fmt == "parquet":
        parquet = pq.ParquetFile(path)
        total = max(parquet.metadata.num_rows, 1)
        done = [0]

        def counted() -> Iterator[pa.RecordBatch]:
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
                done[0] += batch.num_rows
                yield batch
        return parquet.schema_arrow, counted(), lambda: done[0] / total
    if fmt == "arrow":
        with open(path, "rb") as magic:
            is_file = magic.read(6) == b"ARROW1"
        source = pa.memory_map(str(path))
        if is_file:  # read by offsets, not moving the file's position: the share is of its batches
            reader = ipc.open_file(source)
            taken = [0]

            def read() -> Iterator[pa.RecordBatch]:
                for k in range(reader.num_record_batches):
                    taken[0] = k + 1
                    yield reader.get_batch(k)
            return reader.schema, read(), lambda: taken[0] / max(reader.num_record_batches, 1)
        stream = ipc.open_stream(source)
        return stream.schema, iter(stream), lambda: source.tell() / max(path.stat().st_size, 1)
    return _text_batches(path, fmt)


def load(connection, path: Path, table: str, mode: str = "create", fmt: str | None = None,
         progress: Callable[[float, int], None] = lambda share, rows: None) -> int:
    """Ingest the file into `table` over an ADBC connection, a batch at a time; the rows loaded."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
    schema, source, share = batches(path, file_format(path, fmt))
    rows = [0]

    def sent() -> Iterator[pa.RecordBatch]:
        for batch in source:
            rows[0] += batch.num_rows
            progress(share(), rows[0])
            yield batch
    with connection.cursor() as cursor:
        cursor.adbc_ingest(table, pa.RecordBatchReader.from_batches(schema, sent()), mode=mode)
    return rows[0]


def bar(stream) -> Callable[[float, int], None]:
    """A progress line on `stream`, redrawn at most ten times a second."""
    last = [0.0]

    def draw(share: float, rows: int) -> None:
        now = time.monotonic()
        if now - last[0] < 0.1 and share < 1:
            return
        last[0] = now
        filled = int(30 * min(share, 1.0))
        stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {100 * min(share, 1.0):5.1f}%  {rows:,} rows")
        stream.flush()
    return draw
