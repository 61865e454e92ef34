"""AI calls where the AI core of a SELECT cannot place them (under NOT or OR in a grouped query, in FILTER clauses
and HAVING aggregates, in an outer join's condition, beside a USING join): answered first, once per distinct value
of the columns they read, they give the rows an independent evaluation gives (each prompt's hash decision, the
relational part in Python), and EXPLAIN says so."""

from __future__ import annotations

from quail.planner.planner import ANSWERED_FIRST
from tests.sample_tables import ASPECTS, FILTER, JOIN, OPTS, REVIEWS, decide

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)

CALL = f"AI_FILTER(PROMPT('{FILTER}', body), {OPTS})"


def rows(session, sql: str) -> list[tuple]:
    table = session.sql(sql).run().collect()
    return list(zip(*(column.to_pylist() for column in table.columns)))


def _complaint(session, body: str | None) -> bool | None:
    """The call's answer for a review (NULL for no text, as SQL has it)."""
    return None if body is None else decide(session.runtime, FILTER, "filter", [body])


def test_not_and_or_in_a_grouped_query(session):
    answers = [(r, _complaint(session, r["body"])) for r in REVIEWS.to_pylist()]
    assert rows(session, f"SELECT count(*) FROM reviews WHERE NOT {CALL}") == [
        (sum(answer is False for _, answer in answers),)], "NOT of NULL is NULL: a review of no text is not counted"
    assert rows(session, f"SELECT count(*) FROM reviews WHERE stars >= 4 OR {CALL}") == [
        (sum(r["stars"] >= 4 or answer is True for r, answer in answers),)]
    assert any(answer for _, answer in answers) and not all(answer for _, answer in answers)


def test_filter_clauses_case_and_having_aggregates(session):
    answers = {r["id"]: (r["stars"], _complaint(session, r["body"])) for r in REVIEWS.to_pylist()}
    got = rows(session, f"SELECT stars, count(*) FILTER (WHERE {CALL}) AS n, "
                        f"sum(CASE WHEN {CALL} THEN 10 ELSE 1 END) AS s FROM reviews GROUP BY stars ORDER BY stars")
    want = [(stars, sum(a is True for s, a in answers.values() if s == stars),
             sum(10 if a else 1 for s, a in answers.values() if s == stars))
            for stars in sorted({s for s, _ in answers.values()})]
    assert got == want
    having = rows(session, f"SELECT stars FROM reviews GROUP BY stars HAVING bool_or({CALL}) ORDER BY stars")
    assert having == [(stars,) for stars in sorted({s for s, a in answers.values() if a})]


def test_an_outer_join_keeps_its_unmatched_rows_whatever_its_condition(session):
    got = rows(session, f"SELECT r.id, a.id FROM reviews r LEFT JOIN aspects a ON r.stars = 5 OR "
                        f"AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS}) ORDER BY r.id, a.id")
    want = []
    for review in REVIEWS.to_pylist():
        matched = [aspect["id"] for aspect in ASPECTS.to_pylist() if review["stars"] == 5 or (
            review["body"] is not None and decide(session.runtime, JOIN, "join", [review["body"], aspect["aspect"]]))]
        want += [(review["id"], a) for a in matched] or [(review["id"], None)]
    assert got == want and (7, None) in got and len(got) > len(REVIEWS)


def test_a_join_the_ai_core_does_not_take_is_answered_first_and_explained(session):
    query = (f"SELECT r.id FROM reviews r JOIN reviews s USING (id) WHERE AI_FILTER(PROMPT('{FILTER}', r.body), "
             f"{OPTS}) ORDER BY r.id")
    assert rows(session, query) == [(r["id"],) for r in REVIEWS.to_pylist() if _complaint(session, r["body"])]
    assert ANSWERED_FIRST in session.sql(query).explain()
