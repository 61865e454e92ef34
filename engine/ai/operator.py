"""What every AI kind's operator does: the contract the executor sequences, and the two ways rows leave it.

- An operator turns one AI step's rows into model work and the answers into the step's output; each kind's
  operator lives in a file of its own (filter.py, score.py, classify.py, complete.py), named by kinds.py's
  table and loaded by `of(kind)`.
- Yes/no kinds (`Shared`) give an `Ask`: the executor queues the asks of several steps in one call
  (their passes shared) and hands each operator its P(yes) back (`values`).
- Other kinds (`Alone`) are asked in a call of their own (`answer`).
- Each operator shapes its output (`output`: rows kept, or a column added) and its EXPLAIN ANALYZE stage.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from quail.engine.ai.asking import Ask, Question
from quail.engine.ai.kinds import KINDS
from quail.engine.ai.options import Generation
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime


@dataclass(frozen=True)
class Call:
    """One AI step's question over its rows: a column of texts per PROMPT argument and the step's hints."""

    question: Question
    args: Sequence[Sequence[str | None]]
    selectivity: float
    generation: Generation | None = None


class Operator:
    """An AI kind's execution: its rows' output from their answers, and its EXPLAIN ANALYZE stage.

    - `shared`: whether its questions are yes/no and may share passes with other steps' (`Shared`).
    - `keeps_rows`: a filter keeps the rows answered yes; any other operator adds its answers as a column.
    """

    shared = False
    keeps_rows = False

    def output(self, rows: pa.Table, answers: pa.Array, column: str) -> pa.Table:
        """The step's rows (its argument columns dropped by the caller) with its answers."""
        return rows.append_column(column, answers)

    def stage(self, call: Call, answers: pa.Array, out: pa.Table) -> dict:
        """What EXPLAIN ANALYZE shows of a run beyond its rows in (none by default)."""
        return {}


class Shared(Operator):
    """A yes/no question per row, its passes queued with other steps' (`ask`), P(yes) to values (`values`).

    - `decide`: its answer is yes or no (filter.py's threshold) rather than P(yes) itself; random weights decide
      it by hash at the step's selectivity.
    """

    shared = True
    decide = True

    def ask(self, call: Call) -> Ask:
        return Ask(call.question, call.args, call.selectivity, decide=self.decide,
                   kept=self.kept if self.keeps_rows else None)

    def kept(self, probabilities: np.ndarray) -> np.ndarray:
        """Which rows stay in the query (the others' documents are the first the KV pool lets go)."""
        return np.ones(len(probabilities), bool)

    def values(self, probabilities: np.ndarray) -> pa.Array:
        """The answers' values (NaN: a NULL argument, SQL's unknown)."""
        raise NotImplementedError


class Alone(Operator):
    """A question answered in a call of its own (a category chosen, a text generated)."""

    def answer(self, runtime: Runtime, call: Call, work: QueryWork | None) -> pa.Array:
        """Each row's answer (NULL where an argument is NULL)."""
        raise NotImplementedError


def of(kind: str) -> Operator:
    """The operator that runs steps of this kind: `<KIND>` of its home module (imported on first use)."""
    return getattr(importlib.import_module(f"quail.engine.ai.{KINDS[kind].home}"), kind.upper())
