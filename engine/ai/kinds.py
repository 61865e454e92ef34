"""The AI function kinds: their SQL names, the value each adds, its Substrait name and the file that runs it.

- Every room reads this one table: the planner binds SQL calls by `SQL_NAMES` and emits AI steps of a kind;
  Substrait export and import name them by `substrait` (quail_ai_functions.yaml declares those names).
- Each kind's execution (rows to requests, answers to values, its threshold, its EXPLAIN ANALYZE figures) is
  one operator in a file of its own under engine/ai/ (`home`), which `operator.of(kind)` loads on first use:
  the planner reads this table without loading the model stack.
"""

from __future__ import annotations

from dataclasses import dataclass
import pyarrow as pa

DEFAULT_SELECTIVITY = 0.2  # an AI filter's expected fraction answered yes, without a hint


@dataclass(frozen=True)
class AIKind:
    """One kind of AI step.

    - `value`: the type of the column the step adds; None for a filter, which keeps the rows answered yes.
    - `projected`: the kind of the same SQL call in a SELECT list (a filter's yes or no becomes a column).
    - `home`: the module under engine/ai/ whose `<NAME>` (the kind's name in capitals) is its operator.
    """

    name: str
    substrait: str
    value: pa.DataType | None
    projected: str
    home: str


KINDS: dict[str, AIKind] = {kind.name: kind for kind in (
    AIKind("filter", "ai_filter", None, "bool", "filter"),
    AIKind("bool", "ai_bool", pa.bool_(), "bool", "filter"),
    AIKind("score", "ai_score", pa.float64(), "score", "score"),
    AIKind("classify", "ai_classify", pa.string(), "classify", "classify"),
    AIKind("complete", "ai_complete", pa.string(), "complete", "complete"),
)}

SQL_NAMES: dict[str, str] = {  # Snowflake's spellings and BigQuery's (AI.IF, ...) → the kind they bind to
    "AI_FILTER": "filter", "AI.IF": "filter",
    "AI_SCORE": "score", "AI.SCORE": "score",
    "AI_CLASSIFY": "classify", "AI.CLASSIFY": "classify",
    "AI_COMPLETE": "complete", "AI.GENERATE": "complete", "AI_EXTRACT": "complete",
}

