"""What SQL may run in DuckDB: a statement's verdict is its shape's, numbers aside (engine/exec/sql_guard.py)."""

import doctest

import pytest

from quail.engine.errors import InvalidArgument, NotFound
from quail.engine.exec import sql_guard

ROWS = frozenset({"reviews"})


def test_doctests():
    failed, tried = doctest.testmod(sql_guard)
    assert tried and not failed


def test_statements_that_differ_only_in_their_numbers_are_parsed_once():
    sql = "SELECT id, CAST(stars AS DECIMAL(10, 2)) AS s FROM reviews WHERE id BETWEEN {} AND {} LIMIT {}"
    sql_guard.check(sql.format(1000, 1019, 5), ROWS)
    parsed = sql_guard._check_shape.cache_info().misses
    for first in range(1020, 1200, 20):
        sql_guard.check(sql.format(first, first + 19, 7), ROWS)
    assert sql_guard._check_shape.cache_info().misses == parsed


@pytest.mark.parametrize("sql, error", [
    ("SELECT * FROM read_csv('/etc/passwd') LIMIT 10", InvalidArgument),
    ("SELECT sleep_ms(100) FROM reviews WHERE id = 3", InvalidArgument),
    ("SELECT * FROM other WHERE id = 12", NotFound),
    ("SELECT * FROM main.reviews WHERE id = 12", NotFound),
])
def test_what_is_refused_stays_refused_whatever_its_numbers(sql, error):
    for number in ("1", "12", "-7.5"):
        with pytest.raises(error):
            sql_guard.check(sql.replace("12", number), ROWS)


def test_the_table_limit_counts_references_whatever_the_numbers():
    union = " UNION ALL ".join(f"SELECT {k} AS n FROM reviews" for k in range(sql_guard.MAX_TABLES + 1))
    with pytest.raises(InvalidArgument, match="at most"):
        sql_guard.check(union, ROWS)


@pytest.mark.parametrize("sql", ["SELECT 0x1F FROM reviews", "SELECT reviews.1 FROM reviews",
                                 "SELECT 3abc FROM reviews", 'SELECT "a"1 FROM reviews', "SELECT $1 FROM reviews",
                                 "SELECT 1e FROM reviews"])
def test_a_number_that_is_not_plain_or_stands_against_a_name_keeps_the_statement_its_own_shape(sql):
    assert sql_guard.shape(sql) == sql
