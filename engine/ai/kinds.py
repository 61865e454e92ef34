"""The AI function kinds: their SQL names, the value each adds, its Substrait name and how it is answered.

Every room reads this one table: the planner binds SQL calls by `SQL_NAMES`
and emits AI steps of a kind; the executor types and decides their answers;
Substrait export and import name them by `substrait` (quail_ai_functions.yaml
declares those names).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

DEFAULT_SELECTIVITY = 0.2  # an AI filter's expected fraction answered yes, without a hint
YES = 0.5  # P(yes) above this answers yes


def answered_yes(probabilities: np.ndarray) -> np.ndarray:
    """Which P(yes) answer yes (NaN, SQL's unknown, answers neither: compare with np.isnan)."""
    return probabilities > YES


@dataclass(frozen=True)
class AIKind:
    """One kind of AI step.

    `answer`: "yes_no" (P(yes) > YES decides), "probability" (P(yes) itself),
    "category" (the most probable of the call's categories) or "text" (generated). `value`: the type
    of the column the step adds; None for a filter, which keeps the rows
    answered yes instead. `projected`: the kind of the same SQL call in a
    SELECT list (a filter's yes or no becomes a column).
    """

    name: str
    substrait: str
    answer: str
    value: pa.DataType | None
    projected: str

    @property
    def keeps_rows(self) -> bool:
        return self.value is None


KINDS: dict[str, AIKind] = {kind.name: kind for kind in (
    AIKind("filter", "ai_filter", "yes_no", None, "bool"),
    AIKind("bool", "ai_bool", "yes_no", pa.bool_(), "bool"),
    AIKind("score", "ai_score", "probability", pa.float64(), "score"),
    AIKind("classify", "ai_classify", "category", pa.string(), "classify"),
    AIKind("complete", "ai_complete", "text", pa.string(), "complete"),
)}

SQL_NAMES: dict[str, str] = {  # Snowflake's spellings and BigQuery's (AI.IF, ...) → the kind they bind to
    "AI_FILTER": "filter", "AI.IF": "filter",
    "AI_SCORE": "score", "AI.SCORE": "score",
    "AI_CLASSIFY": "classify", "AI.CLASSIFY": "classify",
    "AI_COMPLETE": "complete", "AI.GENERATE": "complete", "AI_EXTRACT": "complete",
}
