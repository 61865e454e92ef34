"""AI_SCORE's operator (BigQuery's AI.SCORE): P(yes) of each row's question, a DOUBLE in [0, 1].

- Its passes are shared with yes/no steps' (the same one-token answer, read as a probability).
- Random weights give each prompt a uniform number fixed by its content (asking.content_hash).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from quail.engine.ai.operator import Shared


class Score(Shared):
    """P(yes) per row (NULL where an argument is NULL)."""

    decide = False

    def values(self, probabilities: np.ndarray) -> pa.Array:
        return pa.array(probabilities, pa.float64(), from_pandas=True)


SCORE = Score()
