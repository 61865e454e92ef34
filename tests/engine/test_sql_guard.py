"""What SQL may run in DuckDB (engine/exec/sql_guard.py): statements of the kinds that reach outside the
database refused, the table limit of a query, a query's verdict its shape's, numbers aside."""

import pytest

from quail.engine.errors import InvalidArgument
from quail.engine.exec import sql_guard


def test_statements_that_differ_only_in_their_numbers_are_parsed_once():
    sql = "SELECT id, CAST(stars AS DECIMAL(10, 2)) AS s FROM reviews WHERE id BETWEEN {} AND {} LIMIT {}"
    sql_guard.check(sql.format(1000, 1019, 5))
    parsed = sql_guard._check_shape.cache_info().misses
    for first in range(1020, 1200, 20):
        sql_guard.check(sql.format(first, first + 19, 7))
    assert sql_guard._check_shape.cache_info().misses == parsed


@pytest.mark.parametrize("sql", ["COPY reviews TO 'out.csv'", "EXPORT DATABASE 'dump'", "INSTALL httpfs",
                                 "LOAD httpfs", "ATTACH 'other.duckdb' AS other", "DETACH other",
                                 "SELECT 1; COPY reviews TO 'out.csv'"])
def test_statements_that_reach_outside_the_database_are_refused(sql):
    with pytest.raises(InvalidArgument, match="reach only its own database"):
        sql_guard.statements(sql)


def test_statements_split_with_their_kinds_and_a_syntax_error_names_its_place():
    assert sql_guard.statements("CREATE TABLE t (a INT); INSERT INTO t VALUES (1); SELECT * FROM t -- done") == [
        ("CREATE", "CREATE TABLE t (a INT);"), ("INSERT", "INSERT INTO t VALUES (1);"),
        ("SELECT", "SELECT * FROM t -- done")]
    with pytest.raises(InvalidArgument, match="LINE 1"):
        sql_guard.statements("SELECT * FROM t WHERE")


def test_the_table_limit_counts_references_whatever_the_numbers():
    union = " UNION ALL ".join(f"SELECT {k} AS n FROM reviews" for k in range(sql_guard.MAX_TABLES + 1))
    with pytest.raises(InvalidArgument, match="at most"):
        sql_guard.check(union)
    sql_guard.check(" UNION ALL ".join(f"SELECT {k} AS n FROM reviews" for k in range(sql_guard.MAX_TABLES)))


@pytest.mark.parametrize("sql", ["SELECT 0x1F FROM reviews", "SELECT reviews.1 FROM reviews",
                                 "SELECT 3abc FROM reviews", 'SELECT "a"1 FROM reviews', "SELECT $1 FROM reviews",
                                 "SELECT 1e FROM reviews"])
def test_a_number_that_is_not_plain_or_stands_against_a_name_keeps_the_statement_its_own_shape(sql):
    assert sql_guard.shape(sql) == sql
