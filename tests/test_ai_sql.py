"""AI-SQL constructs through the Python API, each against an independent evaluation.

The independent side builds each prompt with the documented layout, scores it
on its own (or takes its content-hash decision), and does the relational part
in plain Python; rows must be equal. Hash decisions (the forward pass still
runs) make the row sets non-trivial at a stated selectivity with a tiny model.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

import quail
from quail.engine.ai.asking import Question, build_requests, content_hash
from quail.engine.errors import InvalidArgument
from quail.engine.exec.executor import execute
from quail.engine.exec.plan import AIFilterChain
from quail.planner.planner import plan_sql
from tests.sample_tables import ASPECTS, FILTER, JOIN, OPTS, REVIEWS, SELECTIVITY, decide

KV_SHARED_BY_ITS_TESTS = True
SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)


def rows(session, sql: str) -> list[tuple]:
    table = session.sql(sql).run().collect()
    return list(zip(*(column.to_pylist() for column in table.columns)))


def test_filter_with_relational_conditions(session):
    got = rows(session, f"SELECT id FROM reviews WHERE stars < 5 AND AI_FILTER(PROMPT('{FILTER}', body), {OPTS}) "
                        "ORDER BY id")
    want = [(r["id"],) for r in REVIEWS.to_pylist()
            if r["stars"] < 5 and r["body"] is not None and decide(session.runtime, FILTER, "filter", [r["body"]])]
    assert got == want and want


def test_join_on_ai_condition(session):
    got = rows(session, f"SELECT r.id, a.id FROM reviews r JOIN aspects a "
                        f"ON AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS}) ORDER BY 1, 2")
    want = sorted((r["id"], a["id"]) for r in REVIEWS.to_pylist() for a in ASPECTS.to_pylist()
                  if r["body"] is not None and decide(session.runtime, JOIN, "join", [r["body"], a["aspect"]]))
    assert got == want and want


def test_join_with_equality_and_two_ai_joins_on_aliases(session):
    got = rows(session, f"SELECT r.id, a.id, b.id FROM reviews r "
                        f"JOIN aspects a ON AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS}) "
                        f"JOIN aspects b ON a.id < b.id AND AI_FILTER(PROMPT('{JOIN}', r.body, b.aspect), {OPTS}) "
                        "ORDER BY 1, 2, 3")
    hits = {(r["id"], a["id"]) for r in REVIEWS.to_pylist() for a in ASPECTS.to_pylist()
            if r["body"] is not None and decide(session.runtime, JOIN, "join", [r["body"], a["aspect"]])}
    want = sorted((r, a, b) for (r, a) in hits for (r2, b) in hits if r == r2 and a < b)
    assert got == want and want


@pytest.mark.parametrize("variant", [
    "SELECT r.id, a.id FROM aspects a JOIN reviews r ON AI_FILTER(PROMPT('{J}', r.body, a.aspect), {O}) ORDER BY 1, 2",
    "SELECT r.id, a.id FROM reviews r, aspects a WHERE AI_FILTER(PROMPT('{J}', r.body, a.aspect), {O}) ORDER BY 1, 2",
    "SELECT r.id, a.id FROM reviews r JOIN aspects a ON r.stars > 0 "
    "WHERE AI_FILTER(PROMPT('{J}', r.body, a.aspect), {O}) ORDER BY 1, 2",
], ids=["swapped-sides", "where-instead-of-on", "moved-between-on-and-where"])
def test_metamorphic_join_forms_keep_rows(session, variant):
    reference = rows(session, f"SELECT r.id, a.id FROM reviews r JOIN aspects a "
                              f"ON AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS}) ORDER BY 1, 2")
    assert rows(session, variant.format(J=JOIN, O=OPTS)) == reference


def test_reordered_conjuncts_keep_rows(session):
    a = rows(session, f"SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{FILTER}', body), {OPTS}) AND stars > 1 "
                      f"AND AI_FILTER(PROMPT('Is {{0}} short?', body), {OPTS}) ORDER BY id")
    b = rows(session, f"SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {{0}} short?', body), {OPTS}) "
                      f"AND stars > 1 AND AI_FILTER(PROMPT('{FILTER}', body), {OPTS}) ORDER BY id")
    assert a == b


def test_classify_in_list_and_group_by(session):
    labels = ["food", "price", "service"]
    question = Question("Which category does {0} belong to?", labels=tuple(labels))

    def label(body):
        (request,) = build_requests(session.runtime, question, [[body]])
        return labels[int(content_hash(request) * 3)]

    got = rows(session, "SELECT AI_CLASSIFY(body, ['food', 'price', 'service']):labels[0]::string AS l, count(*) "
                        "FROM reviews WHERE body IS NOT NULL GROUP BY l ORDER BY l")
    counts: dict[str, int] = {}
    for body in REVIEWS["body"].to_pylist():
        if body is not None:
            counts[label(body)] = counts.get(label(body), 0) + 1
    assert got == sorted(counts.items())
    kept = rows(session, "SELECT id FROM reviews WHERE AI_CLASSIFY(body, ['food', 'price', 'service'])"
                         ":labels[0]::string IN ('food', 'service') ORDER BY id")
    assert kept == [(r["id"],) for r in REVIEWS.to_pylist() if r["body"] and label(r["body"]) in ("food", "service")]


def test_bigquery_classify_returns_a_string(session):
    result = session.sql("SELECT AI.CLASSIFY(body, ['food', 'price']) AS l FROM reviews WHERE id = 0",
                         dialect="bigquery").run()
    assert result.schema.field("l").type == pa.string() and result.to_rows()[0]["l"] in ("food", "price")


def test_case_with_an_ai_condition(session):
    got = rows(session, f"SELECT id, CASE WHEN AI_FILTER(PROMPT('{FILTER}', body), {OPTS}) THEN 'bad' ELSE 'ok' END "
                        "FROM reviews WHERE body IS NOT NULL ORDER BY id")
    want = [(r["id"], "bad" if decide(session.runtime, FILTER, "filter", [r["body"]]) else "ok")
            for r in REVIEWS.to_pylist() if r["body"] is not None]
    assert got == want


def test_score_orders_by_the_models_probability(runtime):
    session = quail.Session(runtime=runtime)
    session.register("reviews", REVIEWS)
    got = rows(session, "SELECT id, AI_SCORE(PROMPT('Is {0} positive?', body)) AS p FROM reviews "
                        "WHERE body IS NOT NULL ORDER BY p DESC LIMIT 3")
    bodies = {r["id"]: r["body"] for r in REVIEWS.to_pylist() if r["body"] is not None}
    requests = build_requests(runtime, Question("Is {0} positive?"), [[b] for b in bodies.values()])
    scores = {i: float(np.exp(runtime.variant("naive").score([r])[0][1])) for i, r in zip(bodies, requests)}
    want = sorted(scores.items(), key=lambda kv: -kv[1])[:3]
    assert [g[0] for g in got] == [w[0] for w in want]
    assert np.allclose([g[1] for g in got], [w[1] for w in want], atol=1e-4)


def test_limit_reaches_the_model(runtime):
    session = quail.Session(runtime=runtime.variant("quail"))
    session.runtime.decisions = "hash"
    bodies = [f"Review number {i} of a small cafe." for i in range(500)]
    session.register("many", pa.table({"id": list(range(500)), "body": bodies}))
    sql = f"SELECT id FROM many WHERE AI_FILTER(PROMPT('{FILTER}', body), {OPTS}) LIMIT 10"
    result = session.sql(sql).run()
    assert result.report.requests < 100, "scoring stops once 10 rows have passed"
    passing = [i for i, b in enumerate(bodies) if decide(session.runtime, FILTER, "filter", [b])]
    assert [r["id"] for r in result.to_rows()] == passing[:10], "the first passing rows, in table order"
    ordered = session.sql(f"SELECT id FROM many WHERE AI_FILTER(PROMPT('{FILTER}', body), {OPTS}) "
                          "ORDER BY id DESC LIMIT 10")
    assert not any(isinstance(s, AIFilterChain) for s in ordered.plan.steps), "ORDER BY needs every row scored"


def complaints(session) -> list[int]:
    """Ids of the reviews the FILTER question holds for, evaluated independently."""
    return [r["id"] for r in REVIEWS.to_pylist()
            if r["body"] is not None and decide(session.runtime, FILTER, "filter", [r["body"]])]


@pytest.mark.parametrize("sql", [
    "WITH bad AS (SELECT id, stars FROM reviews WHERE AI_FILTER(PROMPT('{F}', body), {O})) "
    "SELECT id FROM bad ORDER BY id",
    "SELECT id FROM (SELECT * FROM reviews WHERE AI_FILTER(PROMPT('{F}', body), {O})) AS b ORDER BY id",
    "SELECT id FROM reviews WHERE id IN (SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{F}', body), {O})) "
    "ORDER BY id",
    "WITH r AS (SELECT * FROM reviews WHERE stars > 0) "
    "SELECT id FROM r WHERE AI_FILTER(PROMPT('{F}', body), {O}) ORDER BY id",
    "WITH r AS (SELECT * FROM reviews), bad AS (SELECT id FROM r WHERE AI_FILTER(PROMPT('{F}', body), {O})) "
    "SELECT id FROM bad ORDER BY id",
], ids=["cte", "derived-table", "in-subquery", "ai-over-a-cte", "cte-over-a-cte"])
def test_ai_in_ctes_and_subqueries_keeps_rows(session, sql):
    """Wrapping the filter in a CTE, a derived table or a subquery leaves the rows as they are."""
    assert rows(session, sql.format(F=FILTER, O=OPTS)) == [(i,) for i in complaints(session)]


def test_outer_join_and_union_around_ai(session):
    hits = set(complaints(session))
    got = rows(session, f"SELECT a.id, b.id FROM reviews a LEFT JOIN "
                        f"(SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{FILTER}', body), {OPTS})) b "
                        "ON a.id = b.id ORDER BY a.id")
    assert got == [(i, i if i in hits else None) for i in range(len(REVIEWS))]
    union = rows(session, f"SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{FILTER}', body), {OPTS}) "
                          "UNION ALL SELECT id FROM reviews WHERE stars = 5 ORDER BY id")
    assert union == sorted((i,) for i in list(hits) + [r["id"] for r in REVIEWS.to_pylist() if r["stars"] == 5])


def test_anchor_option_puts_its_document_first(session):
    """{'anchor': 1}: the aspect leads every prompt (shared by the reviews asked about it); same question."""
    opts = f"{{'selectivity': {SELECTIVITY}, 'anchor': 1}}"
    got = rows(session, f"SELECT r.id, a.id FROM reviews r JOIN aspects a "
                        f"ON AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {opts}) ORDER BY 1, 2")
    want = sorted((r["id"], a["id"]) for r in REVIEWS.to_pylist() for a in ASPECTS.to_pylist()
                  if r["body"] is not None and decide(session.runtime, JOIN, "join", [r["body"], a["aspect"]], 1))
    assert got == want and want
    (request,) = build_requests(session.runtime, Question(JOIN, "join", anchor=1), [["a review", "the food"]])
    assert session.runtime.tokenizer.decode(request.segments[1].ids).startswith("Text 2:\nthe food")


def test_ai_values_over_two_tables(session):
    """An AI call naming two tables as a value (SELECT) and inside a condition (NOT ...): one ask per pair."""
    ask = f"AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS})"
    got = rows(session, f"SELECT r.id, a.id, {ask} AS hit FROM reviews r JOIN aspects a ON r.stars >= 4 "
                        "ORDER BY 1, 2")
    pairs = [(r, a) for r in REVIEWS.to_pylist() for a in ASPECTS.to_pylist() if r["stars"] >= 4]
    want = [(r["id"], a["id"], None if r["body"] is None else decide(session.runtime, JOIN, "join",
                                                                     [r["body"], a["aspect"]]))
            for r, a in pairs]
    assert got == want and {w[2] for w in want} >= {True, False}
    negated = rows(session, f"SELECT r.id, a.id FROM reviews r JOIN aspects a ON r.stars >= 4 WHERE NOT {ask} "
                            "ORDER BY 1, 2")
    assert negated == [(i, j) for i, j, hit in want if hit is False]


def test_left_join_on_an_ai_condition(session):
    """Every review stays; its aspects are the ones the ON conditions (AI and plain, either side) match."""
    hit = {(r["id"], a["id"]) for r in REVIEWS.to_pylist() for a in ASPECTS.to_pylist()
           if r["body"] is not None and decide(session.runtime, JOIN, "join", [r["body"], a["aspect"]])}

    def left(match) -> list[tuple]:
        out = []
        for r in REVIEWS.to_pylist():
            found = sorted(a["id"] for a in ASPECTS.to_pylist() if match(r, a))
            out += [(r["id"], a) for a in found] or [(r["id"], None)]
        return out

    ask = f"AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS})"
    got = rows(session, f"SELECT r.id, a.id FROM reviews r LEFT JOIN aspects a ON {ask} ORDER BY 1, 2 NULLS LAST")
    assert got == left(lambda r, a: (r["id"], a["id"]) in hit) and (0, None) not in got
    got = rows(session, f"SELECT r.id, a.id FROM reviews r LEFT JOIN aspects a ON r.stars >= 4 AND a.id > 0 "
                        f"AND {ask} ORDER BY 1, 2 NULLS LAST")
    assert got == left(lambda r, a: r["stars"] >= 4 and a["id"] > 0 and (r["id"], a["id"]) in hit)
    unmatched = rows(session, f"SELECT r.id FROM reviews r LEFT JOIN aspects a ON {ask} WHERE a.id IS NULL "
                              "ORDER BY 1")
    assert unmatched == [(i,) for i, a in left(lambda r, a: (r["id"], a["id"]) in hit) if a is None]


def _relational_reference(session, sql: str) -> list[tuple]:
    """The query in DuckDB alone, each AI condition replaced by a lookup of its independent decisions.

    {pair:X:Y} stands for the JOIN question over X.body and Y.aspect, {food:X} for
    the FILTER question over X.aspect, {bad:X} for the FILTER question over X.body.
    """
    import duckdb

    reviews, aspects = REVIEWS.to_pylist(), ASPECTS.to_pylist()
    pairs = pa.table({"r": [r["id"] for r in reviews for a in aspects], "a": [a["id"] for r in reviews for a in aspects],
                      "hit": [r["body"] is not None and decide(session.runtime, JOIN, "join", [r["body"], a["aspect"]])
                              for r in reviews for a in aspects]})
    food = pa.table({"a": [a["id"] for a in aspects],
                     "hit": [decide(session.runtime, FILTER, "filter", [a["aspect"]]) for a in aspects]})
    bad = pa.table({"r": [r["id"] for r in reviews],
                    "hit": [r["body"] is not None and decide(session.runtime, FILTER, "filter", [r["body"]])
                            for r in reviews]})
    con = duckdb.connect()
    for name, table in [("reviews", REVIEWS), ("aspects", ASPECTS), ("pairs", pairs), ("food", food), ("bad", bad)]:
        con.register(name, table)
    import re
    sql = re.sub(r"\{pair:(\w+):(\w+)\}", r"EXISTS (SELECT 1 FROM pairs h WHERE h.r = \1.id AND h.a = \2.id AND h.hit)", sql)
    sql = re.sub(r"\{food:(\w+)\}", r"EXISTS (SELECT 1 FROM food h WHERE h.a = \1.id AND h.hit)", sql)
    sql = re.sub(r"\{bad:(\w+)\}", r"EXISTS (SELECT 1 FROM bad h WHERE h.r = \1.id AND h.hit)", sql)
    return con.execute(sql).fetchall()


def _with_ai(sql: str) -> str:
    """The same query with the AI conditions written out."""
    import re
    sql = re.sub(r"\{pair:(\w+):(\w+)\}", rf"AI_FILTER(PROMPT('{JOIN}', \1.body, \2.aspect), {OPTS})", sql)
    sql = re.sub(r"\{food:(\w+)\}", rf"AI_FILTER(PROMPT('{FILTER}', \1.aspect), {OPTS})", sql)
    return re.sub(r"\{bad:(\w+)\}", rf"AI_FILTER(PROMPT('{FILTER}', \1.body), {OPTS})", sql)


@pytest.mark.parametrize("sql", [
    "SELECT r.id, a.id FROM reviews r RIGHT JOIN aspects a ON {pair:r:a}",
    "SELECT r.id, a.id FROM reviews r RIGHT JOIN aspects a ON r.stars <= 2 AND {pair:r:a} WHERE {food:a}",
    "SELECT r.id, a.id FROM reviews r RIGHT JOIN aspects a ON {pair:r:a} WHERE {bad:r} OR r.id IS NULL",
    "SELECT r.id, a.id FROM reviews r RIGHT JOIN aspects a ON {pair:r:a} WHERE {bad:r}",
    "SELECT r.id, a.id FROM reviews r FULL JOIN aspects a ON a.id > 0 AND {pair:r:a}",
    "SELECT r.id, a.id FROM reviews r FULL OUTER JOIN aspects a ON {pair:r:a} WHERE r.stars > 1 OR a.id IS NULL",
    "SELECT r.id, a.id, b.id FROM reviews r JOIN aspects a ON {pair:r:a} "
    "FULL JOIN aspects b ON a.id < b.id AND {pair:r:b}",
    "SELECT r.id, a.id, b.id FROM reviews r LEFT JOIN aspects a ON {pair:r:a} "
    "RIGHT JOIN aspects b ON a.id = b.id AND {food:b}",
], ids=["right", "right-plain-on-and-where", "right-where-on-null-side", "right-where-ai-on-null-side",
        "full", "full-where", "inner-then-full", "left-then-right"])
def test_right_and_full_joins_on_ai_conditions(session, sql):
    """RIGHT and FULL joins with AI conditions in ON and WHERE: the rows DuckDB gives for the
    same query over the independently decided conditions."""
    def ordered(found: list[tuple]) -> list[tuple]:
        return sorted(found, key=lambda row: [(v is None, v or 0) for v in row])

    want = ordered(_relational_reference(session, sql))
    assert ordered(rows(session, _with_ai(sql))) == want and want


def test_every_order_returns_the_same_rows(session):
    sql = (f"SELECT r.id, a.id, b.id FROM reviews r "
           f"JOIN aspects a ON AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS}) "
           f"JOIN aspects b ON a.id < b.id AND AI_FILTER(PROMPT('{JOIN}', r.body, b.aspect), {OPTS})")
    chosen = sorted(rows(session, sql))
    assert chosen
    for order in itertools.permutations(["r", "a", "b"]):
        plan = plan_sql(sql, session.catalog, join_order=order)
        table = execute(plan, session.catalog, session.runtime)
        assert sorted(zip(*(c.to_pylist() for c in table.columns))) == chosen, order
    explained = session.sql("EXPLAIN " + sql).collect().column(0).to_pylist()
    assert explained[0].startswith("note: join order ") and "the query's order" in explained[0]


def test_distinct_having_window_and_offset_around_ai(session):
    """The relational rest of the query runs in DuckDB over the AI core's rows."""
    hits = set(complaints(session))
    flag = f"AI_FILTER(PROMPT('{FILTER}', body), {OPTS})"
    stars = {r["id"]: r["stars"] for r in REVIEWS.to_pylist()}
    got = rows(session, f"SELECT DISTINCT stars FROM reviews WHERE {flag} ORDER BY stars")
    assert got == sorted({(stars[i],) for i in hits})
    got = rows(session, f"SELECT {flag} AS bad, count(*) AS n FROM reviews WHERE body IS NOT NULL "
                        "GROUP BY bad HAVING count(*) >= 1 ORDER BY bad")
    counts = {False: 0, True: 0}
    for r in REVIEWS.to_pylist():
        if r["body"] is not None:
            counts[r["id"] in hits] += 1
    assert got == [(k, v) for k, v in sorted(counts.items()) if v >= 1]
    got = rows(session, f"SELECT id, row_number() OVER (ORDER BY id DESC) AS k FROM reviews WHERE {flag} "
                        "ORDER BY id LIMIT 2 OFFSET 1")
    ordered = sorted(hits)
    assert got == [(i, len(ordered) - ordered.index(i)) for i in ordered[1:3]]


@pytest.mark.parametrize("sql", [
    "SELECT r.id FROM reviews r WHERE EXISTS (SELECT 1 FROM aspects a WHERE a.id > 0 AND {pair:r:a})",
    "SELECT r.id FROM reviews r WHERE NOT EXISTS (SELECT 1 FROM aspects a WHERE {pair:r:a})",
    "SELECT r.id, r.stars FROM reviews r WHERE r.stars < 5 AND 2 IN (SELECT a.id FROM aspects a WHERE {pair:r:a})",
    "SELECT a.id FROM aspects a WHERE EXISTS (SELECT 1 FROM reviews r WHERE r.stars = 1 AND {pair:r:a} LIMIT 1)",
    "SELECT r.id FROM reviews r WHERE {bad:r} AND EXISTS (SELECT 1 FROM aspects a WHERE {pair:r:a})",
    "SELECT r.id, a.id FROM reviews r JOIN aspects a ON r.stars > 1 "
    "WHERE EXISTS (SELECT 1 FROM aspects b WHERE b.id <> a.id AND {pair:r:b})",
], ids=["exists", "not-exists", "in", "exists-limit", "exists-beside-ai-filter", "exists-over-a-join"])
def test_correlated_subqueries_with_ai(session, sql):
    """A correlated EXISTS / IN with an AI condition: the rows DuckDB gives for the same query over the
    independently decided conditions, each distinct outer value asked once."""
    def ordered(found: list[tuple]) -> list[tuple]:
        return sorted(found, key=lambda row: [(v is None, v or 0) for v in row])

    want = ordered(_relational_reference(session, sql))
    query = session.sql(_with_ai(sql)).run()
    assert ordered(list(zip(*(c.to_pylist() for c in query.collect().columns)))) == want and want
    bodies = {r["body"] for r in REVIEWS.to_pylist()}
    assert query.report.requests <= len(bodies) * len(ASPECTS) + len(REVIEWS), "one ask per distinct outer value"


@pytest.mark.parametrize("sql, message", [
    (f"SELECT r.id FROM reviews r WHERE 1 NOT IN (SELECT a.id FROM aspects a WHERE AI_FILTER(PROMPT('{JOIN}', "
     "r.body, a.aspect)))", "NOT IN, ALL or ANY over a correlated subquery"),
    (f"SELECT r.id FROM reviews r WHERE 1 < (SELECT count(*) FROM aspects a WHERE AI_FILTER(PROMPT('{JOIN}', "
     "r.body, a.aspect)))", "supported in EXISTS and IN only"),
    (f"SELECT r.id FROM reviews r WHERE EXISTS (SELECT a.id FROM aspects a WHERE AI_FILTER(PROMPT('{JOIN}', "
     "r.body, a.aspect)) GROUP BY a.id)", "grouping, aggregates"),
])
def test_unsupported_correlated_subqueries_name_the_problem(session, sql, message):
    with pytest.raises(InvalidArgument, match=message):
        session.sql(sql).run()


def test_left_join_equals_the_swapped_right_join(session):
    ask = f"AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS})"
    left = rows(session, f"SELECT r.id, a.id FROM reviews r LEFT JOIN aspects a ON {ask} ORDER BY 1, 2 NULLS LAST")
    right = rows(session, f"SELECT r.id, a.id FROM aspects a RIGHT JOIN reviews r ON {ask} ORDER BY 1, 2 NULLS LAST")
    assert left == right and any(a is None for _, a in left)


def test_join_order_rechosen_by_the_cores_observed_rows(session):
    """Kept orders: the estimate's cheapest and the cheapest under a tenfold misestimate of one table;
    the executor picks by the cores' observed rows; every kept order returns the same rows."""
    from quail.engine.exec.plan import JoinChoice

    sql = (f"SELECT r.id, a.id, q.id FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), "
           f"{OPTS}) JOIN reviews q ON AI_FILTER(PROMPT('{JOIN}', q.body, a.aspect), {OPTS}) WHERE q.stars = 5")
    (choice,) = [s for s in session.sql(sql).plan.steps if isinstance(s, JoinChoice)]
    assert choice.orders[0] == ("a", "q", "r") and ("r", "q", "a") in choice.orders
    assert choice.pick([8, 3, 2]) == 0, "the rows as they are: the planned order"
    assert choice.orders[choice.pick([1, 3, 8])][0] == "r", "one review left: start from it"
    want = sorted(rows(session, sql))
    assert want
    for order in choice.orders:
        table = execute(plan_sql(sql, session.catalog, join_order=order), session.catalog, session.runtime)
        assert sorted(zip(*(c.to_pylist() for c in table.columns))) == want, order
    analyzed = session.sql("EXPLAIN ANALYZE " + sql).collect().column(0).to_pylist()
    assert any(line.startswith("stage join_order -> ") and "cores of [8, 3, 2] rows" in line for line in analyzed)
