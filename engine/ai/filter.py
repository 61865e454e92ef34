"""AI_FILTER's operator (BigQuery's AI.IF): a yes/no question per row, in a WHERE (rows kept) or as a value.

- Yes is P(yes) above YES; a NULL argument answers neither (SQL's unknown: the row is not kept).
- FILTER keeps the rows answered yes, and the KV pool lets go of the rejected rows' documents first.
- BOOL is the same question in a SELECT list or a CASE: a BOOLEAN column.
- EXPLAIN ANALYZE shows the rows out and the share answered yes beside the selectivity the plan expected.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quail.engine.ai.operator import Call, Shared

YES = 0.5  # P(yes) above this answers yes


def answered_yes(probabilities: np.ndarray) -> np.ndarray:
    """Which P(yes) answer yes (NaN, SQL's unknown, answers neither).

    >>> answered_yes(np.array([0.2, 0.7, np.nan])).tolist()
    [False, True, False]
    """
    return probabilities > YES


class Bool(Shared):
    """The yes or no of each row as a BOOLEAN (NULL where an argument is NULL)."""

    def values(self, probabilities: np.ndarray) -> pa.Array:
        return pa.array(np.where(np.isnan(probabilities), None, answered_yes(probabilities)).tolist(), pa.bool_())

    def stage(self, call: Call, answers: pa.Array, out: pa.Table) -> dict:
        yes = int(pc.sum(pc.fill_null(answers, False).cast(pa.int64())).as_py() or 0)
        return {"rows_out": out.num_rows, "selectivity_provided": call.selectivity,
                "selectivity_observed": yes / len(answers)}


class Filter(Bool):
    """The rows answered yes."""

    keeps_rows = True

    def kept(self, probabilities: np.ndarray) -> np.ndarray:
        return answered_yes(probabilities)

    def output(self, rows: pa.Table, answers: pa.Array, column: str) -> pa.Table:
        return rows.filter(pc.fill_null(answers, False))


FILTER = Filter()
BOOL = Bool()
