"""The earlier store's data directories, read once to import their tables into the DuckDB database.

Quail once kept each table as Arrow IPC part files under a JSON manifest, in
the subfolder `quail-store/` of the data directory (earlier still, directly in
the data directory). On the first open of such a directory, every table it
lists is created in the database, with all its rows and columns, in one
transaction; only after that transaction has committed is the old folder
renamed `quail-store.imported/` (its files kept until the user deletes them).
A crash before the commit leaves the old folder to be imported again; one
after it, tables that exist already (this import's) to be skipped.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc

STORE = "quail-store"
IMPORTED = "quail-store.imported"
MANIFEST = "manifest.json"
_FORMAT = 1
log = logging.getLogger("quail.database")


def manifest_of(data_dir: Path) -> Path | None:
    """The earlier store's manifest in a data directory (its subfolder's, else the older layout's), or None."""
    for manifest in (data_dir / STORE / MANIFEST, data_dir / MANIFEST):
        if manifest.is_file():
            body = json.loads(manifest.read_text())
            if body.get("format") == _FORMAT and isinstance(body.get("tables"), dict):
                return manifest
    return None


def read_tables(manifest: Path) -> dict[str, pa.Table]:
    """Every table the manifest lists, by its name as created: its parts' rows, in order."""
    tables = {}
    for name, entry in json.loads(manifest.read_text())["tables"].items():
        parts = [ipc.open_file(pa.memory_map(str(manifest.parent / part))).read_all() for part in entry["parts"]]
        tables[name] = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    return tables


def upgrade(data_dir: Path, con: duckdb.DuckDBPyConnection) -> None:
    """Import an earlier store found in the data directory into the database, then set its files aside."""
    manifest = manifest_of(data_dir)
    if manifest is None:
        return
    tables = read_tables(manifest)
    log.info("importing %d tables from the earlier store in %s into the database; its files stay in place "
             "until the import has committed", len(tables), manifest.parent)
    existing = {name.lower() for (name,) in con.sql("SELECT table_name FROM duckdb_tables() WHERE "
                                                     "schema_name = 'main'").fetchall()}
    con.execute("BEGIN")
    try:
        for name, table in tables.items():
            if name.lower() in existing:
                continue
            con.register("__quail_import", table)
            con.execute(f'CREATE TABLE "{name.replace(chr(34), chr(34) * 2)}" AS SELECT * FROM __quail_import')
            con.unregister("__quail_import")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    aside = _set_aside(data_dir, manifest)
    log.info("imported %d tables, %d rows; the earlier store's files are kept in %s (delete them when you no "
             "longer need them)", len(tables), sum(t.num_rows for t in tables.values()), aside)


def _set_aside(data_dir: Path, manifest: Path) -> Path:
    """Move the imported store's folder (or, in the older layout, its manifest and parts) to IMPORTED."""
    aside = data_dir / IMPORTED
    if manifest.parent != data_dir:
        os.replace(manifest.parent, aside)
        return aside
    aside.mkdir(exist_ok=True)
    parts = [part for entry in json.loads(manifest.read_text())["tables"].values() for part in entry["parts"]]
    for part in parts:
        if (data_dir / part).exists():
            os.replace(data_dir / part, aside / part)
    os.replace(manifest, aside / MANIFEST)
    return aside
