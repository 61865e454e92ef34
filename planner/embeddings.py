"""AI_EMBED and AI_SIMILARITY in every dialect, spelled as DuckDB runs them over the engine's `ai_embed`.

- AI_EMBED(text), Snowflake's AI_EMBED(model, text), BigQuery's AI.EMBED(content [, endpoint => ...]):
  `ai_embed(model, text)` (engine/exec/embedding_functions.py), a FLOAT[n] L2-normalized; the model is
  'default' where none is named. BigQuery's is a STRUCT of `result` (the embedding) and `status` ('').
- AI_SIMILARITY(a, b), BigQuery's AI.SIMILARITY(content1 => a, content2 => b): the cosine of their
  embeddings (`ai_cosine`). A text argument is embedded; one that already is an embedding (a stored
  FLOAT[n] column, an AI_EMBED) is used as it is: DuckDB tells which by its type when it binds the
  statement, and keeps only that branch.
- An unaliased item of the outermost SELECT keeps the name it had as written.

>>> tree = parse_one("SELECT id FROM t ORDER BY AI_SIMILARITY(body, 'soup') DESC LIMIT 3", read="duckdb")
>>> spell_embeddings(tree, "duckdb", "")
True
>>> print(tree.sql("duckdb"))  # doctest: +NORMALIZE_WHITESPACE
SELECT id FROM t ORDER BY AI_COSINE(CASE WHEN TYPEOF(body) = 'VARCHAR' THEN
CAST(AI_EMBED('default', CAST(body AS TEXT)) AS REAL[]) ELSE CAST(body AS REAL[]) END,
CASE WHEN TYPEOF('soup') = 'VARCHAR' THEN CAST(AI_EMBED('default', CAST('soup' AS TEXT)) AS REAL[])
ELSE CAST('soup' AS REAL[]) END) DESC LIMIT 3
"""

from __future__ import annotations

from sqlglot import exp, parse_one

from quail.engine.errors import InvalidArgument

from quail.planner.ai_calls import EMBEDDING, embedding_name, named_arguments
from quail.planner.dialects import DIALECTS, position, written_items

DEFAULT_MODEL = "default"
SIMILARITY = ("AI_SIMILARITY", "AI.SIMILARITY")
_VECTOR = "CASE WHEN typeof(X) = 'VARCHAR' THEN CAST(ai_embed('default', CAST(X AS VARCHAR)) AS FLOAT[]) " \
          "ELSE CAST(X AS FLOAT[]) END"
MARGIN = 1e-5  # the pairs' slack below a join's threshold: DuckDB's float cosine against ai_cosine's float64
_PAIRS = """EXISTS (SELECT 1 FROM (SELECT __sim_l.t AS lt, __sim_r.t AS rt FROM
  (SELECT t, v FROM (SELECT t, VL AS v FROM (SELECT DISTINCT AL AS t FROM TL) AS __sim_dl WHERE t IS NOT NULL)
   AS __sim_vl WHERE v IS NOT NULL) AS __sim_l,
  (SELECT t, v FROM (SELECT t, VR AS v FROM (SELECT DISTINCT AR AS t FROM TR) AS __sim_dr WHERE t IS NOT NULL)
   AS __sim_vr WHERE v IS NOT NULL) AS __sim_r
  WHERE list_cosine_similarity(__sim_l.v, __sim_r.v) > LOW) AS __sim_p
 WHERE __sim_p.lt = OL AND __sim_p.rt = OR_ AND CHECK)"""
_PARAMETERS = {"AI.SIMILARITY": ("content1", "content2"), "AI.EMBED": ("content",)}
_IGNORED = {"endpoint", "connection_id", "model_params", "task_type", "title"}


def spell_embeddings(tree: exp.Expression, dialect: str, sql: str) -> bool:
    """Rewrite the statement's embedding calls (innermost first) in place; whether it had any. `sql` is its
    text (for the names of the outermost SELECT's items; empty: as the dialect writes them)."""
    if not any(embedding_name(node) in EMBEDDING for node in tree.walk()):
        return False
    _keep_names(tree, dialect, sql)
    _prefilter_joins(tree)
    calls = [node for node in tree.walk() if embedding_name(node) in EMBEDDING]
    for call in reversed(calls):  # innermost first: an argument is rewritten before the call around it
        call.replace(_spelled(call))
    return True


def _prefilter_joins(tree: exp.Expression) -> None:
    """Each conjunct `AI_SIMILARITY(a.x, b.y) > t` (>=, or t < ...) of an inner join's ON or of a WHERE, whose
    arguments read two different tables of the same FROM, asked of pairs found once instead of every pair of
    rows: the distinct values of each side embedded once, their pairs whose cosine passes (DuckDB's own,
    vectorized, MARGIN below t) kept, and the exact condition checked on those pairs alone (an EXISTS: the
    same rows, as a conjunct where NULL and false both reject)."""
    for select in list(tree.find_all(exp.Select)):
        tables = _tables(select)
        conditions = [join.args["on"] for join in select.args.get("joins") or []
                      if not join.side and (join.kind or "INNER").upper() == "INNER" and join.args.get("on")]
        if select.args.get("where") is not None:
            conditions.append(select.args["where"].this)
        for condition in conditions:
            for conjunct in list(condition.flatten()) if isinstance(condition, exp.And) else [condition]:
                found = _threshold(conjunct)
                if found is None:
                    continue
                (first, second), low = found
                sides = (_alias(first), _alias(second))
                if None not in sides and sides[0] != sides[1] and all(side in tables for side in sides):
                    conjunct.replace(_pairs(conjunct, (first, tables[sides[0]]), (second, tables[sides[1]]), low))


def _tables(select: exp.Select) -> dict[str, exp.Expression]:
    """The FROM's and the joins' tables and derived tables, by alias (or name)."""
    sources = [select.args["from_"].this] if select.args.get("from_") is not None else []
    sources += [join.this for join in select.args.get("joins") or []]
    return {source.alias_or_name: source for source in sources if isinstance(source, (exp.Table, exp.Subquery))}


def _threshold(conjunct: exp.Expression) -> tuple[list[exp.Expression], float] | None:
    """The two arguments of the AI_SIMILARITY call of `call > t` (>=, t < call, t <= call), and t - MARGIN."""
    if isinstance(conjunct, (exp.GT, exp.GTE)):
        call, bound = conjunct.this, conjunct.expression
    elif isinstance(conjunct, (exp.LT, exp.LTE)):
        call, bound = conjunct.expression, conjunct.this
    else:
        return None
    negative = isinstance(bound, exp.Neg)
    number = bound.this if negative else bound
    name = embedding_name(call)
    if name not in SIMILARITY or not (isinstance(number, exp.Literal) and number.is_number):
        return None
    args = _arguments(name, call)
    return (args, (-1 if negative else 1) * float(number.this) - MARGIN) if len(args) == 2 else None


def _alias(argument: exp.Expression) -> str | None:
    """The one table alias every column of the argument names (None: none, several, an unqualified column, or
    a subquery)."""
    columns = list(argument.find_all(exp.Column))
    aliases = {column.table for column in columns}
    if not columns or "" in aliases or len(aliases) != 1 or argument.find(exp.Query) is not None:
        return None
    return aliases.pop()


def _pairs(conjunct: exp.Expression, first: tuple[exp.Expression, exp.Expression],
           second: tuple[exp.Expression, exp.Expression], low: float) -> exp.Expression:
    """The EXISTS standing for the conjunct (see _prefilter_joins); `first` and `second`: each argument with
    the table it reads."""
    exact = conjunct.copy()  # the exact condition, asked of a pair
    exact_call = next(node for node in exact.walk() if embedding_name(node) in SIMILARITY)
    exact_call.replace(exp.Anonymous(this="AI_SIMILARITY", expressions=[exp.column("lt", "__sim_p"),
                                                                         exp.column("rt", "__sim_p")]))
    vector = _vector(exp.column("t"))
    return _filled(_PAIRS, {"AL": first[0], "TL": first[1], "VL": vector, "AR": second[0], "TR": second[1],
                            "VR": vector, "OL": first[0], "OR_": second[0], "CHECK": exact,
                            "LOW": exp.Literal.number(repr(low))})


def _keep_names(tree: exp.Expression, dialect: str, sql: str) -> None:
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
    args = _arguments(name, call)
    if name in SIMILARITY:
        if len(args) != 2:
            raise InvalidArgument(f"{name} compares two values (texts, or embeddings), not {len(args)}"
                                  f"{position(call)}")
        return exp.Anonymous(this="ai_cosine", expressions=[_vector(a) for a in args])
    if name == "AI.EMBED":
        if len(args) != 1:
            raise InvalidArgument(f"AI.EMBED embeds one content, not {len(args)}{position(call)}")
        embedded = _embed(exp.Literal.string(DEFAULT_MODEL), args[0])
        return exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier("result"), expression=embedded),
                                       exp.PropertyEQ(this=exp.to_identifier("status"),
                                                      expression=exp.Literal.string(""))])
    if len(args) not in (1, 2):
        raise InvalidArgument(f"AI_EMBED takes a text, or a model and a text, not {len(args)} arguments"
                              f"{position(call)}")
    return _embed(exp.Literal.string(DEFAULT_MODEL) if len(args) == 1 else args[0], args[-1])


def _arguments(name: str, call: exp.Expression) -> list[exp.Expression]:
    """A call's arguments in order: positional ones, then BigQuery's named contents in their order (the
    endpoint and the other options of the model a BigQuery call would reach are ignored: the model is the
    server's)."""
    positional, named = named_arguments(call)
    unknown = set(named) - _IGNORED - set(_PARAMETERS.get(name, ()))
    if unknown:
        raise InvalidArgument(f"{name} takes no argument named {sorted(unknown)[0]}{position(call)}")
    return positional + [named[key] for key in _PARAMETERS.get(name, ()) if key in named]


def _embed(model: exp.Expression, text: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this="ai_embed", expressions=[model, text])


def _vector(argument: exp.Expression) -> exp.Expression:
    """An argument of AI_SIMILARITY as a FLOAT[] list: embedded when it is a text, else cast."""
    return _filled(_VECTOR, {"X": argument})


def _filled(template: str, places: dict[str, exp.Expression]) -> exp.Expression:
    """A DuckDB SQL template parsed, each unqualified column or table named by a key of `places` replaced by
    a copy of its expression."""
    tree = parse_one(template, read="duckdb")
    for node in list(tree.find_all(exp.Column, exp.Table)):
        if node.name in places and not (isinstance(node, exp.Column) and node.table):
            node.replace(places[node.name].copy())
    return tree
