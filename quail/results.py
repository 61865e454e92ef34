"""What a query reads and what it gives back, in-process and over Flight SQL.

- Documents, rows and a report of the work;
- imported by the remote client without the model stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from quail.engine.errors import InvalidArgument


class DocumentProvider:
    """A table of documents: an id column and text columns the prompts refer to."""

    def __init__(self, table: pa.Table, id_col: str | None = None) -> None:
        if id_col is not None and id_col not in table.column_names:
            raise InvalidArgument(f"id column {id_col!r} is not among {table.column_names}")
        self.table = table
        self.id_col = id_col

    @classmethod
    def from_table(cls, table: pa.Table, id_col: str | None = None) -> "DocumentProvider":
        return cls(table, id_col)

    @classmethod
    def from_parquet(cls, path: str | Path, id_col: str | None = None) -> "DocumentProvider":
        return cls(pq.read_table(path), id_col)

    @classmethod
    def from_ipc(cls, path: str | Path, id_col: str | None = None) -> "DocumentProvider":
        with pa.memory_map(str(path)) as source:
            return cls(ipc.open_file(source).read_all(), id_col)


@dataclass
class Report:
    """What a query cost: wall time, tokens asked and computed (and generated), and its speed of light."""

    wall_s: float
    logical_tokens: int
    fresh_tokens: int
    cached_tokens: int
    padded_tokens: int
    physical_tokens: int
    kv_regret_tokens: int
    generated_tokens: int
    decode_steps: int
    requests: int
    forward_passes: int
    stages: list[dict[str, Any]]
    ideal: dict[str, int]
    sol_s: float | None
    host_restored_tokens: int = 0  # of the cached tokens, copied back from the host tier
    disk_restored_tokens: int = 0  # and from the disk tier

    @property
    def sol_fraction(self) -> float | None:
        return self.sol_s / self.wall_s if self.sol_s is not None and self.wall_s > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "sol_fraction": self.sol_fraction}


@dataclass
class Result:
    """Rows of a finished query and its report."""

    table: pa.Table
    report: Report

    def collect(self) -> pa.Table:
        return self.table

    def to_rows(self) -> list[dict[str, Any]]:
        return self.table.to_pylist()

    def count(self) -> int:
        return self.table.num_rows

    @property
    def schema(self) -> pa.Schema:
        return self.table.schema
