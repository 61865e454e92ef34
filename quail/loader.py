"""`quail load`: a CSV, Parquet, JSON lines or Arrow file read on the client and ingested into a table over ADBC.

- The file is read a batch at a time (pyarrow's streaming readers) and sent as it is read; nothing reads it
  on the server (whose file access is off). Parquet and Arrow files larger than memory load; pyarrow's CSV
  and JSON readers read the text ahead of the batches they give, so those must fit in memory as text.
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
BLOCK_BYTES = 8 << 20  # bytes of text a CSV or JSON batch is read from


class _Counted(io.RawIOBase):
    """A file read through, counting the bytes read (the progress of a reader that does not tell)."""

    def __init__(self, path: Path) -> None:
        self.raw = open(path, "rb")
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self.raw.readinto(buffer)
        self.read_bytes += count or 0
        return count

    def close(self) -> None:
        self.raw.close()
        super().close()


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
    counted_file = _Counted(path)
    size = max(path.stat().st_size, 1)
    if fmt == "csv":
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        reader = csv.open_csv(counted_file, read_options=csv.ReadOptions(block_size=BLOCK_BYTES),
                              parse_options=csv.ParseOptions(delimiter=delimiter))
    else:
        reader = json.open_json(counted_file, read_options=json.ReadOptions(block_size=BLOCK_BYTES))
    return reader.schema, iter(reader), lambda: counted_file.read_bytes / size


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
