"""Physical plan nodes: the steps the planner hands to the executor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class SQLStep:
    """Run one DuckDB statement over named relations (tables and earlier outputs)."""

    sql: str
    output: str


@dataclass(frozen=True)
class AIFilterStep:
    """Keep the rows of `input` for which the model answers yes.

    `arg_columns` hold the PROMPT arguments as text, in placeholder order; they
    are dropped from the output, which otherwise has the input's columns.
    `selectivity` is the expected fraction kept (a hint, or the default).
    """

    input: str
    output: str
    template: str
    arg_columns: tuple[str, ...]
    selectivity: float = 0.2


Step = Union[SQLStep, AIFilterStep]


@dataclass(frozen=True)
class PhysicalPlan:
    """Steps in execution order; `tables` are the stored tables they read, `result` the final relation."""

    steps: tuple[Step, ...]
    tables: tuple[str, ...]
    result: str
