"""The data directory: tables as Arrow IPC part files under one atomically replaced manifest.

Quail keeps its files in one subfolder of the data directory, `quail-store/`,
marked as its own by a `QUAIL_STORE` file, and touches nothing else there. A
write lands a new part file (temp name, fsync, rename) and then a new manifest
(same dance); the manifest's rename is the commit point, so a crash at any
moment leaves either the old table or the new one. Part and temp files of
Quail's own naming that no manifest names are leftovers of an interrupted write
and are removed when the store opens. An open store holds an exclusive lock on
the folder, so a second server over the same data directory refuses to start.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from quail.engine.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from quail.engine.exec.catalog import check_names

STORE = "quail-store"  # Quail's subfolder of the data directory
MARKER = "QUAIL_STORE"  # the file that marks the subfolder as Quail's
MANIFEST = "manifest.json"
LOCK = "lock"
_FORMAT = 1
_PART = re.compile(r"[0-9a-f]{32}\.arrow")
_TEMP = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")


@dataclass(frozen=True)
class StoredTable:
    """One committed table: its name as created, schema and part files."""

    name: str
    schema: pa.Schema
    parts: tuple[str, ...]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(path: Path) -> int:
    """An exclusive lock on a file, held while its descriptor is open; Unavailable when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise Unavailable(f"the data directory {path.parent.parent} is in use by another Quail server "
                          f"(process {holder})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class TableStore:
    """Tables of a data directory, loaded memory-mapped and served as immutable Arrow tables. `version`
    counts the commits since it was opened: a plan made at one version holds until the next."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        self.root = self.data_dir / STORE
        self._claim()
        self._lock_fd = _lock(self.root / LOCK)
        self._lock = threading.Lock()
        self._tables: dict[str, StoredTable] = {}
        self._data: dict[str, pa.Table] = {}
        self.version = 0
        self._move_from_data_dir()
        self._load()

    def close(self) -> None:
        """Release the data directory (another server may open it afterwards)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _claim(self) -> None:
        """Create the marked subfolder, or check that the one there is Quail's."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        marker = self.root / MARKER
        if self.root.exists() and not marker.exists() and any(self.root.iterdir()):
            raise Unavailable(f"{self.root} holds files but no {MARKER} file, so it is not Quail's: "
                              "move it away or choose another data directory")
        self.root.mkdir(exist_ok=True)
        if not marker.exists():
            _write_atomic(marker, lambda f: f.write(b"Tables of a Quail server: do not edit files in this folder.\n"))

    def _move_from_data_dir(self) -> None:
        """Adopt a store of the earlier layout (manifest and parts directly in the data directory): its
        parts, then its manifest, move into the subfolder; a crash halfway is completed at the next open."""
        old = self.data_dir / MANIFEST
        if not old.exists() or (self.root / MANIFEST).exists():
            return
        body = json.loads(old.read_text())
        if body.get("format") != _FORMAT or not isinstance(body.get("tables"), dict):
            return
        for entry in body["tables"].values():
            for part in entry["parts"]:
                if (self.data_dir / part).exists():
                    os.replace(self.data_dir / part, self.root / part)
        _fsync_dir(self.root)
        os.replace(old, self.root / MANIFEST)
        _fsync_dir(self.root)
        _fsync_dir(self.data_dir)

    def _load(self) -> None:
        manifest = self.root / MANIFEST
        entries = json.loads(manifest.read_text())["tables"] if manifest.exists() else {}
        for name, entry in entries.items():
            parts = tuple(entry["parts"])
            table = self._read_parts(parts)
            self._tables[name.lower()] = StoredTable(name, table.schema, parts)
            self._data[name.lower()] = table
        live = {p for t in self._tables.values() for p in t.parts}
        for path in self.root.iterdir():
            leftover = _TEMP.fullmatch(path.name) or (_PART.fullmatch(path.name) and path.name not in live)
            if leftover and path.is_file():
                path.unlink()

    def _read_parts(self, parts: tuple[str, ...]) -> pa.Table:
        tables = [ipc.open_file(pa.memory_map(str(self.root / p))).read_all() for p in parts]
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def _write_part(self, table: pa.Table) -> str:
        name = f"{uuid.uuid4().hex}.arrow"

        def write(f) -> None:
            with ipc.new_file(f, table.schema) as writer:
                writer.write_table(table)

        _write_atomic(self.root / name, write)
        return name

    def _commit(self, tables: dict[str, StoredTable]) -> None:
        body = {"format": _FORMAT, "tables": {t.name: {"parts": list(t.parts)} for t in tables.values()}}
        _write_atomic(self.root / MANIFEST, lambda f: f.write(json.dumps(body, indent=1).encode()))

    def names(self) -> list[str]:
        """Table names as created, sorted."""
        return sorted(t.name for t in self._tables.values())

    def has(self, name: str) -> bool:
        return name.lower() in self._tables

    def schema(self, name: str) -> pa.Schema:
        return self._entry(name).schema

    def table(self, name: str) -> pa.Table:
        """The committed rows of a table (zero-copy over the memory-mapped files)."""
        self._entry(name)
        return self._data[name.lower()]

    def _entry(self, name: str) -> StoredTable:
        entry = self._tables.get(name.lower())
        if entry is None:
            raise NotFound(f"table {name!r} does not exist")
        return entry

    def write(self, name: str, table: pa.Table, if_exists: str = "fail", if_missing: str = "create") -> int:
        """Store rows under a name and return how many were written.

        if_exists: "fail", "append" or "replace"; if_missing: "create" or "fail".
        """
        if not name or "/" in name or name.startswith("."):
            raise InvalidArgument(f"invalid table name {name!r}")
        check_names(name, table.schema.names)
        with self._lock:
            key = name.lower()
            old = self._tables.get(key)
            if old is not None and if_exists == "fail":
                raise AlreadyExists(f"table {old.name!r} already exists")
            if old is None and if_missing == "fail":
                raise NotFound(f"table {name!r} does not exist")
            appending = old is not None and if_exists == "append"
            if appending and not table.schema.equals(old.schema, check_metadata=False):
                table = self._conform(table, old.schema)
            part = self._write_part(table)
            entry = StoredTable(old.name if appending else name, old.schema if appending else table.schema,
                                (old.parts if appending else ()) + (part,))
            tables = {**self._tables, key: entry}
            self._commit(tables)
            self._tables = tables
            self._data = {**self._data, key: self._read_parts(entry.parts)}
            self.version += 1
            if old is not None and not appending:
                for p in old.parts:
                    (self.root / p).unlink(missing_ok=True)
            return table.num_rows

    def drop(self, name: str, missing_ok: bool = False) -> None:
        """Remove a table (its files after the manifest no longer names them)."""
        with self._lock:
            old = self._tables.get(name.lower())
            if old is None:
                if missing_ok:
                    return
                raise NotFound(f"table {name!r} does not exist")
            tables = {k: v for k, v in self._tables.items() if k != name.lower()}
            self._commit(tables)
            self._tables = tables
            self._data = {k: v for k, v in self._data.items() if k != name.lower()}
            self.version += 1
            for p in old.parts:
                (self.root / p).unlink(missing_ok=True)

    @staticmethod
    def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
        if table.schema.names != schema.names:
            raise InvalidArgument(f"appended columns {table.schema.names} differ from the table's {schema.names}")
        try:
            return table.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise InvalidArgument(f"appended rows do not fit the table's schema: {err}") from None
