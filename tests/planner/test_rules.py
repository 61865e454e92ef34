"""The planner's rules one by one: the same rows with any rule left out (the rules change what the model is
asked, never the answer; each rule's doctest, SQL in and plan out, runs in tests/test_docs.py)."""

from __future__ import annotations

import pytest

from quail.engine.exec.executor import execute
from quail.engine.runtime.query_work import QueryWork
from quail.planner.planner import plan_sql
from quail.planner.rules import RULES
from quail.planner.rules.examples import catalog

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)


QUERIES = [  # selectivities such that the hashed answers keep some rows and drop others
    "SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body), {'selectivity': 0.7}) AND stars > 1",
    "SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} a long and thoughtful review?', body), "
    "{'selectivity': 0.8}) AND AI_FILTER(PROMPT('Is {0} short?', body), {'selectivity': 0.4}) AND stars >= 2",
    "SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body), {'selectivity': 0.7}) LIMIT 1",
    "SELECT r.id AS r, m.id AS m FROM makers m, reviews r, products p WHERE AI_FILTER(PROMPT('Does {0} suit {1}?', "
    "r.body, m.story), {'selectivity': 0.5}) AND p.maker = m.id AND p.price < 10 ORDER BY r, m",
    "SELECT r.id AS r, p.id AS p FROM products p, reviews r WHERE AI_FILTER(PROMPT('Is {0} about {1}?', p.name, "
    "r.body), {'selectivity': 0.5}) ORDER BY r, p",
]


@pytest.mark.parametrize("query", QUERIES)
def test_any_rule_left_out_keeps_the_rows(runtime, query):
    hashed = runtime.variant("quail")
    hashed.decisions = "hash"
    tables = catalog()

    def rows(rules) -> list:
        return execute(plan_sql(query, tables, "duckdb", rules=rules), tables, hashed, QueryWork()).to_pylist()

    every = rows(RULES)
    assert every == rows(()), "no rule at all"
    for left_out in RULES:
        assert rows(tuple(r for r in RULES if r is not left_out)) == every, left_out.__name__
