"""The names of the functions Quail registers in DuckDB (embedding_functions.py), which the planner writes.

- EMBED, COSINE, PAIRS, TOP_PAIRS: the functions as a statement may call them.
- STOPPING: the suffix of the forms the planner writes, which take the statement's work key first
  (runtime/query_work.py's WORK_VARIABLE), so a cancel or a time limit stops them within a call.
- REGISTERED: every name registered.
"""

EMBED, COSINE, PAIRS, TOP_PAIRS = "ai_embed", "ai_cosine", "ai_similar_pairs", "ai_top_pairs"
STOPPING = "_for"
REGISTERED = (EMBED, COSINE, PAIRS, TOP_PAIRS, EMBED + STOPPING, PAIRS + STOPPING, TOP_PAIRS + STOPPING)
