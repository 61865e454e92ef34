"""`quail load`: CSV, Parquet, JSON lines and Arrow files loaded into a real server's tables over ADBC, in
batches; create, append and replace; a file that does not parse or a table that exists loads nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as csv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import quail
from quail import loader

ROWS = pa.table({"id": pa.array(range(3000), pa.int64()), "name": [f"row {i}" for i in range(3000)],
                 "score": pa.array([i / 7 for i in range(3000)], pa.float64())})


def write(path, fmt: str) -> None:
    if fmt == "csv":
        csv.write_csv(ROWS, path)
    elif fmt == "parquet":
        pq.write_table(ROWS, path, row_group_size=500)
    elif fmt == "json":
        path.write_text("".join(json.dumps(row) + "\n" for row in ROWS.to_pylist()))
    else:
        feather.write_feather(ROWS, path, chunksize=700)


def quail_load(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quail.cli", "load", *args], capture_output=True, text=True,
                          timeout=120)


def table_rows(uri: str, table: str) -> list[dict]:
    with quail.connect(uri, dialect="duckdb") as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, name, score FROM {table} ORDER BY id")
        return cur.fetch_arrow_table().to_pylist()


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl", ".arrow"])
def test_each_format_loads_every_row_as_written(server, tmp_path, suffix):
    path = tmp_path / f"rows{suffix}"
    write(path, loader.file_format(path))
    table = f"loaded_{suffix[1:]}"
    with quail.connect(server.uri) as conn:
        assert loader.load(conn, path, table) == ROWS.num_rows
    assert table_rows(server.uri, table) == ROWS.to_pylist()


def test_the_command_loads_a_file_and_says_how_many_rows(server, tmp_path):
    path = tmp_path / "rows.tsv"
    csv.write_csv(ROWS, path, csv.WriteOptions(delimiter="\t"))
    done = quail_load(str(path), "from_command", server.uri)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("loaded 3,000 rows into from_command")
    assert table_rows(server.uri, "from_command") == ROWS.to_pylist()


def test_a_parquet_file_is_read_and_sent_a_batch_at_a_time(tmp_path):
    """Batch by batch, as they are sent: the share read rises with each (a file larger than memory loads)."""
    path = tmp_path / "big.parquet"
    pq.write_table(pa.concat_tables([ROWS] * 60), path, row_group_size=10_000)
    schema, batches, share = loader.batches(path, "parquet")
    shares, counted = [], 0
    for batch in batches:
        counted += batch.num_rows
        shares.append(share())
    assert counted == 180_000 and len(shares) >= 3 and shares == sorted(shares) and shares[0] < 0.5
    assert shares[-1] == 1.0 and schema.names == ["id", "name", "score"]


def test_append_and_replace(server, tmp_path):
    path = tmp_path / "rows.parquet"
    write(path, "parquet")
    with quail.connect(server.uri) as conn:
        loader.load(conn, path, "modes")
        loader.load(conn, path, "modes", "append")
        assert len(table_rows(server.uri, "modes")) == 6000
        loader.load(conn, path, "modes", "replace")
    assert table_rows(server.uri, "modes") == ROWS.to_pylist()


def test_a_bad_file_or_an_existing_table_loads_nothing_and_says_why(server, tmp_path):
    good = tmp_path / "rows.csv"
    write(good, "csv")
    with quail.connect(server.uri) as conn:
        loader.load(conn, good, "once")
    again = quail_load(str(good), "once", server.uri)
    assert again.returncode == 1 and "nothing was loaded into once" in again.stderr and "Traceback" not in again.stderr
    broken = tmp_path / "broken.csv"
    broken.write_text("id,name\n1,a\n2,b,extra\n")
    failed = quail_load(str(broken), "broken", server.uri)
    assert failed.returncode == 1 and "nothing was loaded into broken" in failed.stderr
    assert "CSV parse error" in failed.stderr and "Traceback" not in failed.stderr
    with pytest.raises(ValueError, match="--format"):
        loader.file_format(tmp_path / "rows.xyz")
    with quail.connect(server.uri, dialect="duckdb") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'broken'")
        assert cur.fetchone() == (0,)


def test_a_file_that_fails_after_batches_were_sent_loads_nothing(server, tmp_path, monkeypatch):
    """The parse error comes after several batches went to the server: the ingest's stream is cut off, and
    the server writes nothing of it (no table, no partial rows)."""
    import adbc_driver_manager

    path = tmp_path / "late.csv"
    csv.write_csv(pa.concat_tables([ROWS] * 30), path)
    with open(path, "a") as tail:
        tail.write("5,x,1.0,extra\n")
    monkeypatch.setattr(loader, "BLOCK_BYTES", 64 << 10)
    sent = []
    with quail.connect(server.uri) as conn, pytest.raises(adbc_driver_manager.Error, match="CSV parse error"):
        loader.load(conn, path, "late", progress=lambda share, rows: sent.append(rows))
    assert len(sent) > 3, "batches went to the server before the error"
    with quail.connect(server.uri, dialect="duckdb") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'late'")
        assert cur.fetchone() == (0,)


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_text_is_read_only_as_its_batches_are_taken(tmp_path, monkeypatch, fmt):
    """Pieces of whole lines, each read when the one before was taken (a file larger than memory loads), the
    rows as written: a quoted CSV value holding a line break stays whole wherever a piece ends."""
    monkeypatch.setattr(loader, "BLOCK_BYTES", 4 << 10)
    rows = pa.table({"id": pa.array(range(4000), pa.int64()),
                     "name": [f"line {i}\nand its \"quoted\" rest" for i in range(4000)]})
    path = tmp_path / f"rows.{'csv' if fmt == 'csv' else 'jsonl'}"
    if fmt == "csv":
        csv.write_csv(rows, path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows.to_pylist()))
    schema, batches, share = loader.batches(path, fmt)
    taken, shares = [], []
    for batch in batches:
        taken.append(batch)
        shares.append(share())
    assert shares[0] < 0.05 and shares == sorted(shares) and shares[-1] == 1.0
    assert pa.Table.from_batches(taken, schema).to_pylist() == rows.to_pylist()


def test_an_arrow_file_s_progress_is_the_share_of_its_batches_read(tmp_path):
    path = tmp_path / "rows.arrow"
    feather.write_feather(ROWS, path, chunksize=600)
    _, batches, share = loader.batches(path, "arrow")
    assert [share() for _ in batches] == [0.2, 0.4, 0.6, 0.8, 1.0]
