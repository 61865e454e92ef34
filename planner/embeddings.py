"""AI_EMBED and AI_SIMILARITY in every dialect, spelled as DuckDB runs them over the engine's `ai_embed`.

- AI_EMBED(text), Snowflake's AI_EMBED(model, text), BigQuery's AI.EMBED(content [, endpoint => ...]):
  `ai_embed_for(<the statement's work>, model, text)` (engine/exec/embedding_functions.py; stopped with the
  statement), a FLOAT[n] L2-normalized; the model is
  'default' where none is named. BigQuery's is a STRUCT of `result` (the embedding) and `status` ('').
- AI_SIMILARITY(a, b), BigQuery's AI.SIMILARITY(content1 => a, content2 => b): the cosine of their
  embeddings (`ai_cosine`). A text argument is embedded; one that already is an embedding (a stored
  FLOAT[n] column, an AI_EMBED) is used as it is: DuckDB tells which by its type when it binds the
  statement, and keeps only that branch.
- An unaliased item of the outermost SELECT keeps the name it had as written.
- Similarity joins and top-k per row are planned as matrix products first (similarity_joins.py).

>>> from sqlglot import parse_one
>>> tree = parse_one("SELECT id FROM t ORDER BY AI_SIMILARITY(body, 'soup') DESC LIMIT 3", read="duckdb")
>>> spell_embeddings(tree, "duckdb", "")
True
>>> print(tree.sql("duckdb"))  # doctest: +NORMALIZE_WHITESPACE
SELECT id FROM t ORDER BY AI_COSINE(CASE WHEN TYPEOF(body) = 'VARCHAR' THEN
CAST(AI_EMBED_FOR(GETVARIABLE('quail_work'), 'default', CAST(body AS TEXT)) AS REAL[])
ELSE CAST(body AS REAL[]) END, CASE WHEN TYPEOF('soup') = 'VARCHAR' THEN
CAST(AI_EMBED_FOR(GETVARIABLE('quail_work'), 'default', CAST('soup' AS TEXT)) AS REAL[])
ELSE CAST('soup' AS REAL[]) END) DESC LIMIT 3
"""

from __future__ import annotations

from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.exec.function_names import COSINE

from quail.planner.ai_calls import EMBEDDING, embedding_name
from quail.planner.dialects import DIALECTS, position, written_items
from quail.planner.embedding_calls import DEFAULT_MODEL, SIMILARITY, arguments, embedded, vector
from quail.planner.similarity_joins import prefilter


def embeds(tree: exp.Expression) -> bool:
    """Whether the statement calls an embedding function (before spell_embeddings rewrites them)."""
    return any(embedding_name(node) in EMBEDDING for node in tree.walk())


def spell_embeddings(tree: exp.Expression, dialect: str, sql: str) -> bool:
    """Rewrite the statement's embedding calls (innermost first) in place; whether it had any. `sql` is its
    text (for the names of the outermost SELECT's items; empty: as the dialect writes them)."""
    if not embeds(tree):
        return False
    name_embedding_items(tree, dialect, sql)
    prefilter(tree)
    calls = [node for node in tree.walk() if embedding_name(node) in EMBEDDING]
    for call in reversed(calls):  # innermost first: an argument is rewritten before the call around it
        call.replace(_spelled(call))
    return True


def name_embedding_items(tree: exp.Expression, dialect: str, sql: str) -> None:
    """Alias the outermost SELECT's unaliased items that call an embedding function by their text."""
    select = tree.find(exp.Select)
    if select is None:
        return
    written = written_items(sql, dialect) if sql else []
    for k, item in enumerate(list(select.expressions)):
        if isinstance(item, (exp.Alias, exp.Star, exp.Column)) or not any(
                embedding_name(n) for n in item.walk()):
            continue
        name = written[k] if len(written) == len(select.expressions) else item.sql(DIALECTS[dialect])
        item.replace(exp.alias_(item.copy(), name, quoted=True))


def _spelled(call: exp.Expression) -> exp.Expression:
    """One embedding call as DuckDB runs it."""
    name = embedding_name(call)
    args = arguments(name, call)
    if name in SIMILARITY:
        if len(args) != 2:
            raise InvalidArgument(f"{name} compares two values (texts, or embeddings), not {len(args)}"
                                  f"{position(call)}")
        return exp.Anonymous(this=COSINE, expressions=[vector(a) for a in args])
    if name == "AI.EMBED":
        if len(args) != 1:
            raise InvalidArgument(f"AI.EMBED embeds one content, not {len(args)}{position(call)}")
        result = embedded(exp.Literal.string(DEFAULT_MODEL), args[0])
        return exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier("result"), expression=result),
                                       exp.PropertyEQ(this=exp.to_identifier("status"),
                                                      expression=exp.Literal.string(""))])
    if len(args) not in (1, 2):
        raise InvalidArgument(f"AI_EMBED takes a text, or a model and a text, not {len(args)} arguments"
                              f"{position(call)}")
    return embedded(exp.Literal.string(DEFAULT_MODEL) if len(args) == 1 else args[0], args[-1])
