"""What `quail sql` prints: results as aligned tables, CSV, JSON lines or an Arrow stream, and a query's progress.

- A table shows each column's name with its Arrow type under it, at most `max_rows` rows (a note says how
  many there were) and a footer: `(3 rows, 0.012 s)`. Cells are cut at CELL_WIDTH characters.
- A statement that changes data (its result: one `rows_affected` column) shows as `OK, 2 rows affected`.
- CSV, JSON lines and Arrow are for scripts: written as the batches arrive, with no footer.
- The progress line: a running query's requests and tokens done of planned, from its `quail_queries` row.
"""

from __future__ import annotations

import json
from typing import BinaryIO, Callable

import pyarrow as pa
import pyarrow.csv as csv
import pyarrow.ipc as ipc

CELL_WIDTH = 60
BAR_WIDTH = 20


def collect(reader: pa.RecordBatchReader, max_rows: int) -> tuple[pa.Table, int]:
    """The first `max_rows` rows of a result (all when 0), and how many it has (it is read to its end)."""
    kept, total = [], 0
    for batch in reader:
        if not max_rows or total < max_rows:
            kept.append(batch.slice(0, max_rows - total) if max_rows else batch)
        total += batch.num_rows
    return pa.Table.from_batches(kept, reader.schema), total


def _through(reader: pa.RecordBatchReader, writer) -> int:
    """Write every batch with a pyarrow writer (CSV, IPC stream), then close it; the rows written."""
    rows = 0
    with writer:
        for batch in reader:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows


def write_json(reader: pa.RecordBatchReader, out: BinaryIO) -> int:
    """A JSON object per row, a line each (values JSON has no type for, e.g. dates, as their text)."""
    rows = 0
    for batch in reader:
        out.write("".join(json.dumps(row, default=str, ensure_ascii=False) + "\n"
                          for row in batch.to_pylist()).encode())
        rows += batch.num_rows
    return rows


WRITERS: dict[str, Callable[[pa.RecordBatchReader, BinaryIO], int]] = {
    "csv": lambda reader, out: _through(reader, csv.CSVWriter(out, reader.schema)), "json": write_json,
    "arrow": lambda reader, out: _through(reader, ipc.new_stream(out, reader.schema))}


def _cell(value: object) -> str:
    text = "NULL" if value is None else str(value).replace("\n", "\\n")
    return text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 1] + "…"


def _rows_word(count: int) -> str:
    return f"{count:,} row" + ("" if count == 1 else "s")


def changed(table: pa.Table) -> int | None:
    """The rows a statement that changes data changed (None: its result is a query's)."""
    if table.column_names == ["rows_affected"] and table.num_rows == 1 and pa.types.is_integer(table.schema[0].type):
        return table.column(0)[0].as_py()
    return None


def render(table: pa.Table, total: int | None = None, seconds: float | None = None) -> str:
    """A result as an aligned table: names, types, rows and a footer of its row count (and its time)."""
    total = table.num_rows if total is None else total
    names = table.column_names
    types = [str(field.type) for field in table.schema]
    cells = [[_cell(value) for value in column.to_pylist()] for column in table.columns]
    widths = [max([len(name), len(kind), *map(len, column)]) for name, kind, column in zip(names, types, cells)]
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
               for f in table.schema]

    def line(values: list[str], right: list[bool]) -> str:
        return "|".join(f" {v.rjust(w) if r else v.ljust(w)} " for v, w, r in zip(values, widths, right)).rstrip()

    left = [False] * len(names)
    lines = [line(names, left), line(types, left), "+".join("-" * (w + 2) for w in widths)]
    lines += [line(list(row), numeric) for row in zip(*cells)]
    footer = _rows_word(total)
    if table.num_rows < total:
        footer += f", {table.num_rows:,} shown (--max-rows or .maxrows)"
    return "\n".join(lines + [f"({footer}" + (f", {seconds:.3f} s)" if seconds is not None else ")")])


def render_changed(rows: int, seconds: float) -> str:
    return f"OK, {_rows_word(rows)} affected ({seconds:.3f} s)"


def progress_line(row: dict | None, seconds: float) -> str:
    """A running query's line: its time, and from its `quail_queries` row (None: not listed yet) the model
    requests it made and its tokens done of those planned so far, with a bar."""
    if row is None or not row["requests"]:
        return f"running {seconds:.1f} s"
    done, planned = row["tokens_done"], row["tokens_planned"]
    share = min(done / planned, 1.0) if planned else 0.0
    filled = int(BAR_WIDTH * share)
    return (f"running {seconds:.1f} s [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {100 * share:3.0f}%  "
            f"{row['requests']:,} requests, {done:,} / {planned:,} tokens")
