"""Similarity joins and top-k per row, planned as matrix products over each side's distinct values.

- Each side's distinct values are embedded once and the pairs of values found by blocked matrix products
  on the device (engine/exec/similar_pairs.py); table b is then joined with those pairs by its value
  (each b row once per a value it pairs with, that value in a column the SELECT's stars leave out), and
  a's value equated with it: a hash join over the pairs, never the cross product of a and b.
- A threshold join: the first conjunct `AI_SIMILARITY(a.x, b.y) > t` (>=, t < ..., NOT (... <= t)) of an
  inner join's ON or of a WHERE, its arguments reading two tables of the FROM: the pairs whose cosine passes,
  MARGIN below t (`ai_similar_pairs_for`); the exact condition still checked on each (NULL and false both
  reject).
- An outer join's ON the same, the pairs joined to the side it does not keep whole (a LEFT JOIN's table; a
  RIGHT JOIN's FROM table, when it is the SELECT's only join): its rows that pair with nothing could never
  match, and a kept row that matches none still comes once, NULL-extended.
- A FULL join's ON that is the threshold conjunct alone, when it is the SELECT's only join: the pairs that
  pass the exact condition, left-joined to one side (a row of it that pairs with nothing comes once, its key
  NULL): every other row of that side matches, so each row of either side that matches none comes once.
- Top k per row: `QUALIFY ROW_NUMBER() (or RANK()) OVER (PARTITION BY <a's columns> ORDER BY
  AI_SIMILARITY(a.x, b.y) DESC, ...) <= k` over `a, b` (a cross join; WHERE conditions on a alone): the pairs
  that can rank within k (`ai_top_pairs_for`: each b value standing for its rows, ties kept) and every pair with
  a NULL side (IS NOT DISTINCT FROM); QUALIFY still ranks them, exactly.
- Each pair carries its cosine exactly as AI_SIMILARITY gives it (a column the stars leave out too): the
  SELECT's calls of AI_SIMILARITY over the same two arguments read it instead of embedding each row's texts
  again.
- The pairs' functions are given the key of the statement's work first (`getvariable('quail_work')`): a
  cancel or time limit stops their products within one block (engine/exec/embedding_functions.py).
- Anything else (OR, a FULL join's other conjuncts, other windows, conditions on b beside a top k) stays
  pairwise.

>>> from sqlglot import parse_one
>>> tree = parse_one("SELECT a.id, b.id FROM a, b QUALIFY ROW_NUMBER() OVER (PARTITION BY a.id "
...                  "ORDER BY AI_SIMILARITY(a.x, b.y) DESC) <= 3", read="duckdb")
>>> prefilter(tree); "ai_top_pairs" in tree.sql("duckdb").lower()
True
"""

from __future__ import annotations

from sqlglot import exp

from quail.engine.exec.function_names import PAIRS, STOPPING, TOP_PAIRS
from quail.planner.ai_calls import embedding_name
from quail.planner.embedding_calls import SIMILARITY, arguments, filled, vector, work_key

MARGIN = 1e-5  # the pairs' slack below a join's threshold: the device's float product against ai_cosine's float64
KEY, SCORE = "__sim_lt", "__sim_s"  # the columns the right table gains: the left value it pairs with, their cosine
_FOUND = """SELECT __sim_l.t AS lt, __sim_r.t AS rt, __sim_q.p.s AS sc
 FROM (SELECT UNNEST(POSITIONS) AS p) AS __sim_q,
  (SELECT t, row_number() OVER (ORDER BY t) AS k FROM (SELECT DISTINCT AL AS t FROM TL) AS __sim_nl
   WHERE t IS NOT NULL) AS __sim_l,
  (SELECT t, row_number() OVER (ORDER BY t) AS k FROM (SELECT DISTINCT AR AS t FROM TR) AS __sim_nr
   WHERE t IS NOT NULL) AS __sim_r
 WHERE __sim_l.k = __sim_q.p.i AND __sim_r.k = __sim_q.p.j"""
_WITH_NULLS = """SELECT lt, rt, sc FROM (FOUND) AS __sim_f
 UNION ALL SELECT NULL AS lt, t AS rt, NULL AS sc FROM (SELECT DISTINCT AR AS t FROM TR) AS __sim_ar
 UNION ALL SELECT t AS lt, NULL AS rt, NULL AS sc FROM (SELECT DISTINCT AL AS t FROM TL) AS __sim_al
  WHERE t IS NOT NULL"""
_SIDE = "(SELECT list(V ORDER BY t) FROM (SELECT DISTINCT A AS t FROM T) AS __sim_d WHERE t IS NOT NULL)"
_COUNTS = "(SELECT list(n ORDER BY t) FROM (SELECT A AS t, count(*) AS n FROM T GROUP BY A) AS __sim_c " \
          "WHERE t IS NOT NULL)"
_PAIRED = "SELECT R.*, __sim_p.lt AS __sim_lt, __sim_p.sc AS __sim_s FROM TR JOIN (FOUND) AS __sim_p " \
          "ON __sim_p.rt IS NOT DISTINCT FROM AR"
_PASSING = "SELECT lt, rt, sc FROM (FOUND) AS __sim_x WHERE EXACT"


def prefilter(tree: exp.Expression) -> None:
    """Rewrite the statement's similarity joins and top-k-per-row windows in place (see the module's
    summary)."""
    for select in list(tree.find_all(exp.Select)):
        if not _prefilter_top_k(select):
            _prefilter_threshold(select)


def _conditions(select: exp.Select) -> list[tuple[exp.Expression, str | None, bool]]:
    """The conditions a threshold conjunct may come from, each with the alias of the table that must take the
    pairs (None: either side's) and whether that table is kept whole: every inner join's ON and the WHERE
    when all joins are inner; else the ON of each LEFT JOIN (its table), of a RIGHT JOIN that is the only join
    (the FROM's table), and of a FULL JOIN that is the only join, when it is a threshold alone (either, whole).

    >>> from sqlglot import parse_one
    >>> [alias for _, alias, _ in _conditions(parse_one("SELECT 1 FROM a LEFT JOIN b ON c JOIN e ON f WHERE g"))]
    ['b']
    >>> full = "SELECT 1 FROM a FULL JOIN b ON AI_SIMILARITY(a.x, b.y) > 0.5"
    >>> [whole for _, _, whole in _conditions(parse_one(full))]
    [True]
    """
    joins = select.args.get("joins") or []
    if all(not join.side and (join.kind or "").upper() in ("", "INNER", "CROSS") for join in joins):
        found = [(join.args["on"], None, False) for join in joins if join.args.get("on")]
        return found + ([(select.args["where"].this, None, False)] if select.args.get("where") is not None else [])
    outer = [join for join in joins if (join.kind or "").upper() in ("", "OUTER") and join.args.get("on")]
    alone = len(joins) == 1
    return ([(join.args["on"], join.this.alias_or_name, False) for join in outer if join.side.upper() == "LEFT"]
            + [(join.args["on"], select.args["from_"].this.alias_or_name, False) for join in outer
               if join.side.upper() == "RIGHT" and alone]
            + [(join.args["on"], None, True) for join in outer
               if join.side.upper() == "FULL" and alone and _threshold(join.args["on"]) is not None])


def _prefilter_threshold(select: exp.Select) -> bool:
    """The first threshold conjunct between two of the SELECT's tables, through the pairs; whether one was."""
    tables = _tables(select)
    for condition, paired, whole in _conditions(select):
        for conjunct in list(condition.flatten()) if isinstance(condition, exp.And) else [condition]:
            found = _threshold(conjunct)
            if found is None:
                continue
            (first, second), low = found
            sides = (_alias(first), _alias(second))
            if None in sides or sides[0] == sides[1] or not all(side in tables for side in sides):
                continue
            if paired is not None and paired not in sides:
                continue
            if sides[0] == paired:  # cosine is symmetric: the pairs go to the second argument's table
                (first, second), sides = (second, first), sides[::-1]
            positions = exp.Anonymous(this=PAIRS + STOPPING, expressions=[
                work_key(), _side(first, tables[sides[0]]), _side(second, tables[sides[1]]),
                exp.Literal.number(repr(low))])
            pairs = _found(positions, first, tables[sides[0]], second, tables[sides[1]])
            if whole:
                pairs = filled(_PASSING, {"FOUND": pairs, "EXACT": _scored(conjunct, exp.column("sc"))})
            key = _paired(select, first, second, tables[sides[1]], pairs, whole)
            conjunct.replace(exp.and_(exp.EQ(this=first.copy(), expression=key), conjunct.copy()))
            return True
    return False


def _prefilter_top_k(select: exp.Select) -> bool:
    """A QUALIFY's top k per row through the pairs that can rank; whether it was."""
    found = _top_k(select)
    tables = _tables(select)
    joins = select.args.get("joins") or []
    if found is None or len(tables) != 2 or len(joins) != 1 or select.args.get("group") is not None:
        return False
    join = joins[0]
    if join.side or (join.kind or "CROSS").upper() != "CROSS" or join.args.get("on") or join.args.get("using"):
        return False
    (first, second), k, partitioned = found
    if _alias(second) == partitioned:
        first, second = second, first
    left, right = _alias(first), _alias(second)
    if left is None or left != partitioned or right is None or right == left or right not in tables:
        return False
    where = select.args.get("where")
    if where is not None and (where.find(exp.Query) is not None or any(
            column.table != left for column in where.find_all(exp.Column))):
        return False  # a condition on b's rows would change which rows rank within k
    positions = exp.Anonymous(this=TOP_PAIRS + STOPPING, expressions=[
        work_key(), _side(first, tables[left]), _side(second, tables[right]),
        filled(_COUNTS, {"A": second, "T": tables[right]}), exp.Literal.number(k)])
    pairs = filled(_WITH_NULLS, {"FOUND": _found(positions, first, tables[left], second, tables[right]),
                                 "AL": first, "TL": tables[left], "AR": second, "TR": tables[right]})
    key = _paired(select, first, second, tables[right], pairs)
    select.where(exp.NullSafeEQ(this=first.copy(), expression=key), copy=False)
    return True


def _top_k(select: exp.Select) -> tuple[list[exp.Expression], int, str | None] | None:
    """The AI_SIMILARITY arguments ordering a QUALIFY's `ROW_NUMBER() / RANK() OVER (PARTITION BY ... ORDER BY
    AI_SIMILARITY(..) DESC, ...) <= k` (or < k + 1, or the window named by a SELECT alias), k, and the one
    table alias the PARTITION BY reads (None: several, or none)."""
    qualify = select.args.get("qualify")
    condition = qualify.this if qualify is not None else None
    sides = _ordered(condition)
    if sides is None:
        return None
    window, bound = sides
    if isinstance(window, exp.Column) and not window.table:
        named = [item.this for item in select.expressions if isinstance(item, exp.Alias) and item.alias == window.name]
        window = named[0] if len(named) == 1 else window
    if not (isinstance(window, exp.Window) and isinstance(window.this, (exp.RowNumber, exp.Rank))
            and isinstance(bound, exp.Literal) and bound.is_int):
        return None
    k = int(bound.this) - (1 if isinstance(condition, (exp.LT, exp.GT)) else 0)
    order = window.args.get("order")
    first = order.expressions[0] if order is not None and order.expressions else None
    name = embedding_name(first.this) if first is not None else None
    if name not in SIMILARITY or not first.args.get("desc") or k < 1:
        return None
    args = arguments(name, first.this)
    partitions = {column.table for part in window.args.get("partition_by") or [] for column in part.find_all(exp.Column)}
    return (args, k, partitions.pop() if len(partitions) == 1 else None) if len(args) == 2 else None


def _ordered(comparison: exp.Expression | None) -> tuple[exp.Expression, exp.Expression] | None:
    """The smaller and the larger side of a `<`, `<=`, `>` or `>=` (None: any other expression)."""
    if isinstance(comparison, (exp.LT, exp.LTE)):
        return comparison.this, comparison.expression
    if isinstance(comparison, (exp.GT, exp.GTE)):
        return comparison.expression, comparison.this
    return None


def _tables(select: exp.Select) -> dict[str, exp.Expression]:
    """The FROM's and the joins' tables and derived tables, by alias (or name)."""
    sources = [select.args["from_"].this] if select.args.get("from_") is not None else []
    sources += [join.this for join in select.args.get("joins") or []]
    return {source.alias_or_name: source for source in sources if isinstance(source, (exp.Table, exp.Subquery))}


def _threshold(conjunct: exp.Expression) -> tuple[list[exp.Expression], float] | None:
    """The two arguments of the AI_SIMILARITY call of `call > t` (>=, t < call, t <= call, NOT (call < t), ...),
    and t - MARGIN. (NOT of a comparison rejects a NULL as the comparison does.)

    >>> from sqlglot import parse_one
    >>> _threshold(parse_one("NOT (AI_SIMILARITY(a.x, b.y) <= 0.5)"))[1] == 0.5 - MARGIN
    True
    """
    negated = isinstance(conjunct, exp.Not)
    sides = _ordered(conjunct.this.unnest() if negated else conjunct)
    if sides is None:
        return None
    bound, call = sides[::-1] if negated else sides
    negative = isinstance(bound, exp.Neg)
    number = bound.this if negative else bound
    name = embedding_name(call)
    if name not in SIMILARITY or not (isinstance(number, exp.Literal) and number.is_number):
        return None
    args = arguments(name, call)
    return (args, (-1 if negative else 1) * float(number.this) - MARGIN) if len(args) == 2 else None


def _alias(argument: exp.Expression) -> str | None:
    """The one table alias every column of the argument names (None: none, several, an unqualified column, or
    a subquery)."""
    columns = list(argument.find_all(exp.Column))
    aliases = {column.table for column in columns}
    if not columns or "" in aliases or len(aliases) != 1 or argument.find(exp.Query) is not None:
        return None
    return aliases.pop()


def _side(argument: exp.Expression, table: exp.Expression) -> exp.Expression:
    """A scalar subquery: the list of the side's distinct non-NULL values' embeddings, in the values' order."""
    return filled(_SIDE, {"V": vector(exp.column("t")), "A": argument, "T": table})


def _found(positions: exp.Expression, first: exp.Expression, first_table: exp.Expression,
           second: exp.Expression, second_table: exp.Expression) -> exp.Expression:
    """The pairs of values (lt, rt) at the 1-based `positions` the pairs' function gives, each side's distinct
    values numbered in order."""
    return filled(_FOUND, {"POSITIONS": positions, "AL": first, "TL": first_table, "AR": second,
                           "TR": second_table})


def _paired(select: exp.Select, first: exp.Expression, argument: exp.Expression, table: exp.Expression,
            pairs: exp.Expression, whole: bool = False) -> exp.Expression:
    """The right table, in place, joined with the pairs of values by its argument's value: each of its rows
    once per left value it pairs with, that value in a column KEY and their cosine in SCORE (which the
    SELECT's stars leave out, and its AI_SIMILARITY calls over `first` and `argument` read); `whole`: a row
    that pairs with none once, KEY NULL (a left join). The KEY column, to be equated with the left argument
    (a hash join, never the cross product)."""
    alias = table.alias_or_name
    joined = filled(_PAIRED, {"TR": table, "FOUND": pairs, "AR": argument})
    if whole:
        joined.args["joins"][0].set("side", "LEFT")
    joined.expressions[0].set("table", exp.to_identifier(alias))
    _read_scores(select, {first.sql(), argument.sql()}, exp.column(SCORE, alias))
    table.replace(exp.Subquery(this=joined, alias=exp.TableAlias(this=exp.to_identifier(alias))))
    for item in select.expressions:
        star = item if isinstance(item, exp.Star) else item.this if isinstance(item, exp.Column) else None
        if isinstance(star, exp.Star) and (item is star or item.table == alias):
            star.set("except_", [*(star.args.get("except_") or []), exp.column(KEY), exp.column(SCORE)])
    return exp.column(KEY, alias)


def _scored(condition: exp.Expression, score: exp.Column) -> exp.Expression:
    """A copy of the condition, its AI_SIMILARITY calls reading `score`."""
    copy = condition.copy()
    for call in list(copy.find_all(exp.Func, exp.Dot)):
        if embedding_name(call) in SIMILARITY:
            call.replace(score.copy())
    return copy


def _read_scores(select: exp.Select, arguments_sql: set[str], score: exp.Column) -> None:
    """Each AI_SIMILARITY call of the SELECT itself (not of a subquery) over these two arguments, in either
    order, replaced by the pairs' score column."""
    for call in list(select.find_all(exp.Func, exp.Dot)):
        name = embedding_name(call)
        if name in SIMILARITY and call.parent_select is select:
            args = arguments(name, call)
            if len(args) == 2 and {arg.sql() for arg in args} == arguments_sql:
                call.replace(score.copy())
