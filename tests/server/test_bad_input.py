"""What a fuzzer, an attacker or a careless BI tool sends, through the real ADBC driver to a real server:
each gets a clear status and message (never INTERNAL, never a silent repair), and the server keeps
answering; result columns are named as the user wrote them."""

from __future__ import annotations

import time

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa
import pytest

import quail
from quail.clients.server_process import ServerProcess

REVIEWS = pa.table({"id": [1, 2, 3, 4], "body": ["Great pasta.", "Cold soup, rude staff.", "A fine film.", None],
                    "stars": [5, 1, 4, 2]})
TOPICS = pa.table({"id": [1, 2], "topic": ["food", "films"]})
SCORE = "AI_SCORE(PROMPT('Is {0} about food?', body))"


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("bad"), "--query-timeout", "10") as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS, mode="create")
            cur.adbc_ingest("topics", TOPICS, mode="create")
        yield server.uri


def _query(uri: str, sql: str) -> pa.Table:
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def _refused(uri: str, sql: str) -> str:
    """The message of the error the statement gets (it must get one)."""
    with pytest.raises(adbc_driver_manager.Error) as err:
        _query(uri, sql)
    message = str(err.value)
    assert "INTERNAL" not in message and "Traceback" not in message, message
    return message


@pytest.mark.parametrize("sql, fragment", [
    ("SELECT r.id FROM reviews r LEFT JOIN topics t ON", "line 1, column 47: ON needs a condition"),
    ("SELECT r.id FROM reviews r JOIN topics t ON WHERE r.id > 1", "ON needs a condition"),
    ("SELECT round(, 1) FROM reviews", "line 1, column 14: an empty item in a list"),
    ("SELECT id FROM reviews WHERE stars BETWEEN -10 A", "BETWEEN needs AND"),
    ("SELECT r.id FROM reviews r, topics t WHERE AI_FILTER(PROMPT('{0} {1}', r.body, , t.topic))",
     "an empty item in a list"),
    ("SELECT coalesce(id, ) FROM reviews", "an empty item in a list"),
    ("SELECT " + "(" * 40 + "1" + ")" * 40, "nest more than 32 deep"),
    ("SELECT " + "NOT " * 100 + "TRUE", "nest more than 32 deep"),
    ("SELECT " + "abs(" * 100 + "1" + ")" * 100, "nest more than 32 deep"),
    ("SELECT " + "CASE WHEN TRUE THEN " * 60 + "1" + " END" * 60, "nest more than 32 deep"),
    ("SELECT id FROM reviews GROUP BY id HAVING count(*) > > 0", "two comparisons in a row"),
    ("SELECT id FROM reviews WHERE body NOT IS NULL", "write IS NOT"),
    ("SELECT id, max(stars AS m FROM reviews GROUP BY id", "this is never closed"),
    ("SELECT r.id FROM reviews r FULL JOIN topics t", "JOIN needs ON or USING"),
    ("WITH w (SELECT 1) SELECT * FROM w", "needs AS before its parentheses"),
    ("SELECT , id FROM reviews", "an empty item in a list"),
    ("SELECT AS TRUE c0 FROM reviews", "AS needs an expression before it"),
    ("SELECT id FROM reviews WHERE stars IN", "IN needs a list or a query"),
    ("SELECT id AS g FROM reviews GROUP BY LATERAL . id", "LATERAL belongs in FROM"),
    ("SELECT length('a' 'b')", "two strings in a row"),
    ("SELECT id FROM reviews * r", "a table name cannot be followed by *"),
    ("SELECT r.id FROM reviews r LEFT JOIN topics t USING", "USING needs its columns"),
    ("SELECT id FROM reviews ORDER BY id OFFSET", "OFFSET needs a number"),
    ("SELECT id FROM reviews ORDER BY id FETCH FIRST", "FETCH needs FIRST or NEXT, a count"),
    ("SELECT * EXCLUDE FROM reviews", "* EXCLUDE needs the columns it names"),
    ("SELECT id FROM reviews FOR UPDATE", "locking reads"),
    ("SELECT * FROM reviews PIVOT", "PIVOT needs what it pivots"),
    ("SELECT * FROM reviews WINDOW", "WINDOW needs its definitions"),
], ids=["left-join-on-nothing", "on-then-where", "empty-argument", "between-without-and", "empty-prompt-argument",
        "trailing-comma", "deep-parentheses", "deep-not", "deep-calls", "deep-case", "two-comparisons", "not-is",
        "unclosed-call", "full-join-without-on", "with-without-as", "leading-comma", "as-without-expression",
        "in-without-list", "lateral-in-group-by", "two-strings", "table-star", "using-nothing", "offset-nothing",
        "fetch-first-alone", "exclude-nothing", "for-update", "trailing-pivot", "trailing-window"])
def test_malformed_sql_is_a_syntax_error_with_its_position_not_repaired(uri, sql, fragment):
    message = _refused(uri, sql)
    assert message.startswith("INVALID_ARGUMENT") and fragment in message, message


@pytest.mark.parametrize("sql, status, fragment", [
    ("SELECT * FROM read_text('/etc/passwd')", "UNAUTHORIZED", "reach only its own database"),
    ("SELECT * FROM '/etc/passwd'", "NOT_FOUND", "does not exist"),
    ("SELECT * FROM LATERAL query('SELECT * FROM read_csv(''/etc/passwd'')')", "UNAUTHORIZED",
     "reach only its own database"),
    ("COPY reviews TO '/tmp/reviews.csv'", "INVALID_ARGUMENT", "COPY statements are not available"),
    ("ATTACH '/tmp/other.duckdb' AS other", "INVALID_ARGUMENT", "ATTACH statements are not available"),
    ("INSTALL httpfs", "INVALID_ARGUMENT", "LOAD statements are not available"),
    ("SET enable_external_access = true", "INVALID_ARGUMENT", "configuration has been locked"),
    ("SELECT * FROM (SELECT 1) t, LATERAL (SELECT * FROM read_text('/etc/hosts'))", "UNAUTHORIZED",
     "reach only its own database"),
], ids=["read-text", "file-path", "query-of-a-file", "copy", "attach", "install", "set", "lateral-in-a-subquery"])
def test_nothing_outside_the_database_is_reached(uri, sql, status, fragment):
    """The database opens with no external access and its configuration locked: files, other databases,
    extensions and settings are refused clearly (PERMISSION_DENIED reads UNAUTHORIZED in ADBC's words), the
    statements as DuckDB reads them."""
    with quail.connect(uri, dialect="duckdb") as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error) as err:
            cur.execute(sql)
            cur.fetchall()
    message = str(err.value)
    assert message.startswith(status) and fragment in message, message


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM range(5)", "SELECT count(*) FROM information_schema.tables WHERE table_name = 'reviews'",
    "SELECT count(*) FROM duckdb_settings() WHERE name = 'threads'", "SELECT count(*) FROM (SELECT 1) t, "
    "LATERAL (SELECT * FROM range(3))", "SELECT count(*) FROM TABLE(GENERATOR(ROWCOUNT => 4))"],
    ids=["range", "information-schema", "settings", "lateral", "snowflake-generator"])
def test_the_database_s_own_table_functions_and_catalog_views_run(uri, sql):
    assert _query(uri, sql).num_rows == 1


@pytest.mark.parametrize("sql, fragment", [
    ("SELECT id FROM reviews WHERE AI_FILTER('Is it sunny?')", "asks nothing of the rows"),
    ("SELECT AI_SCORE('constant') FROM reviews", "asks nothing of the rows"),
    ("SELECT AI_CLASSIFY(PROMPT('no placeholders'), ['a', 'b']) FROM reviews", "asks nothing of the rows"),
    (f"SELECT {SCORE} OVER () FROM reviews", "not a window function"),
    ("SELECT AI_CLASSIFY(body, ['only']) FROM reviews", "needs 2 to 26 distinct categories, not 1"),
    (f"SELECT stars, {SCORE} FROM reviews GROUP BY stars", "reads column 'body', which is neither grouped"),
    ("SELECT max(body), AI_SCORE(PROMPT('{0}', max(body))) FROM reviews", "over aggregates is not supported"),
], ids=["filter-without-document", "score-of-a-constant", "classify-without-document", "window", "one-category",
        "ungrouped-column", "over-an-aggregate"])
def test_ai_calls_that_cannot_be_asked_are_invalid(uri, sql, fragment):
    message = _refused(uri, sql)
    assert message.startswith("INVALID_ARGUMENT") and fragment in message, message


@pytest.mark.parametrize("sql", [
    f"SELECT id FROM reviews ORDER BY {SCORE} + 'a'",
    "SELECT CASE WHEN AI_FILTER(PROMPT('Is {0} good?', body)) THEN 1 ELSE 'x' END + 1 FROM reviews",
    "SELECT id FROM reviews WHERE AI_CLASSIFY(body, ['a', 'b']) > 5",
    "SELECT id FROM reviews WHERE NOT AI_FILTER(PROMPT('Is {0} good?', body)) AND id + 'x' > 1",
], ids=["order-by", "case", "classify-compared", "not-filter"])
def test_an_error_in_a_statement_quail_wrote_names_nothing_of_quail_s_own(uri, sql):
    """DuckDB's message about a step of an AI plan, without the step's text or Quail's column names."""
    message = _refused(uri, sql)
    assert message.startswith("INVALID_ARGUMENT") and "__quail" not in message.lower() and "LINE 1" not in message


def test_reserved_names_are_refused_and_cannot_change_results(uri):
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        for name in ("__quail_sub_1", "__QUAIL_result"):
            with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*reserved"):
                cur.adbc_ingest(name, pa.table({"id": [4]}), mode="create")
        with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*reserved"):
            cur.adbc_ingest("fine", pa.table({"__quail_rid": [4]}), mode="create")
        with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*reserved"):
            cur.execute("CREATE TABLE __quail_t AS SELECT 1 AS x")
        with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*reserved"):  # not a plan's row ids
            cur.execute(f"SELECT * FROM (SELECT id * 10 AS __quail_rid, body FROM reviews) x WHERE {SCORE} > 2 OR TRUE")
    got = _query(uri, f"SELECT id FROM reviews WHERE id IN (SELECT id FROM reviews WHERE {SCORE} >= 0) ORDER BY id")
    assert got["id"].to_pylist() == [1, 2, 3]


def test_huge_limits_and_long_conditions_plan(uri):
    assert _query(uri, "SELECT id FROM reviews ORDER BY id LIMIT 9223372036854775807")["id"].to_pylist() == [1, 2, 3, 4]
    got = _query(uri, f"SELECT id FROM reviews WHERE {SCORE} >= 0 LIMIT 9223372036854775807")
    assert sorted(got["id"].to_pylist()) == [1, 2, 3]
    terms = " AND ".join(f"id <> {i}" for i in range(10, 1008))
    got = _query(uri, f"SELECT id FROM reviews WHERE {terms} AND AI_FILTER(PROMPT('Is {{0}} short?', body)) "
                      f"AND id < 3 ORDER BY id")
    assert set(got["id"].to_pylist()) <= {1, 2}


@pytest.mark.parametrize("dialect", ["duckdb", "snowflake"])
def test_a_condition_of_thousands_of_terms_is_refused_not_left_to_end_the_server(uri, dialect):
    """DuckDB's optimizer takes minutes over 4,000 ANDed comparisons and ends its process over 40,000: past
    1,000 ANDs and ORs a statement is refused at once (RESOURCE_EXHAUSTED), and the server serves on."""
    terms = " AND ".join(f"id <> {i}" for i in range(2_000))
    with quail.connect(uri, dialect=dialect) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error, match="joins 1,999 conditions with AND / OR: at most 1,000"):
            cur.execute(f"SELECT count(*) FROM reviews WHERE {terms}")
    assert _query(uri, "SELECT count(*) AS n FROM reviews")["n"].to_pylist() == [4]


def test_a_statement_of_more_than_64_tables_is_refused_at_once(uri):
    def joined(n: int) -> str:
        tables = ", ".join(f"reviews a{i}" for i in range(n))
        chain = " AND ".join(f"a{i}.id = a{i + 1}.id" for i in range(n - 1))
        return f"SELECT count(*) AS n FROM {tables} WHERE {chain}"

    assert _query(uri, joined(64))["n"].to_pylist() == [4]
    started = time.monotonic()
    message = _refused(uri, joined(300))
    assert message.startswith("INVALID_ARGUMENT") and "at most 64 tables, not 300" in message
    assert time.monotonic() - started < 10, "DuckDB never plans it"


def test_result_columns_are_named_as_written(uri):
    table = _query(uri, f"SELECT id, {SCORE}, AI_FILTER(PROMPT('Is {{0}} kind?', body)), "
                        "AI_CLASSIFY(body, ['food', 'film']) FROM reviews ORDER BY id")
    assert table.column_names == ["id", SCORE, "AI_FILTER(PROMPT('Is {0} kind?', body))",
                                  "AI_CLASSIFY(body, ['food', 'film'])"]
    counted = _query(uri, "SELECT count_if(AI_FILTER(PROMPT('Is {0} kind?', body))) AS n FROM reviews")
    assert counted.schema.field("n").type == pa.int64()
    grouped = _query(uri, "SELECT stars, count(*) AS n FROM reviews GROUP BY stars "
                          "HAVING AI_FILTER(PROMPT('Is {0} a big number?', stars)) OR TRUE ORDER BY stars")
    assert grouped.column_names == ["stars", "n"] and grouped["stars"].to_pylist() == [1, 2, 4, 5]
    nested = _query(uri, f"SELECT * FROM (SELECT id, {SCORE} FROM reviews) WHERE id = 1")
    assert nested.column_names == ["id", SCORE]
    plain = _query(uri, "SELECT var_samp(stars), id IS NOT NULL, CASE WHEN stars > 4 OR stars < 2 THEN 'x' END AS c, "
                        "CASE WHEN stars BETWEEN 1 AND 3 THEN 'y' END AS d FROM reviews GROUP BY ALL ORDER BY c, d")
    assert plain.column_names == ["var_samp(stars)", "id IS NOT NULL", "c", "d"], "as the text writes them"
    assert plain["c"].to_pylist() == ["x", "x", None, None] and plain["d"].to_pylist() == ["y", None, "y", None]
    with quail.connect(uri, dialect="duckdb") as conn, conn.cursor() as cur:
        cur.execute("SELECT var_samp(stars), id IS NOT NULL FROM reviews GROUP BY ALL")
        assert [d[0] for d in cur.description] == ["var_samp(stars)", "(id IS NOT NULL)"], "as DuckDB names them"


@pytest.mark.parametrize("action, error", [
    ("CancelFlightInfo", pa.ArrowInvalid), ("SetSessionOptions", pa.ArrowInvalid),
    ("CancelQuery", pa.ArrowNotImplementedError), ("CreatePreparedStatement", pa.ArrowNotImplementedError),
    ("ClosePreparedStatement", pa.ArrowNotImplementedError)])
def test_garbage_action_bodies_are_refused_clearly(uri, action, error):
    """Bodies that are no message: INVALID_ARGUMENT; no Flight SQL command where one is due: UNIMPLEMENTED."""
    import pyarrow.flight as flight

    client = flight.FlightClient(uri)
    with pytest.raises(error) as err:
        list(client.do_action(flight.Action(action, b"\xff\xff\x00 not a message")))
    assert "internal error" not in str(err.value)
    assert _query(uri, "SELECT count(*) AS n FROM reviews")["n"].to_pylist() == [4]


def test_a_client_stream_that_breaks_off_ends_as_cancelled_without_a_traceback(caplog):
    """Reading a DoPut or DoExchange stream that its client (or the server's stop) broke off raises gRPC's
    own error: the call ends CANCELLED and nothing is logged as an internal error. (A unit test of the
    error mapping; the SIGTERM test in test_server_own.py cuts a real ingest.)"""
    import grpc

    from quail.server.grpc_service import _streaming

    class Context:
        def __init__(self) -> None:
            self.aborted = None

        def code(self):
            return None

        def abort(self, code, details):
            self.aborted = (code, details)
            raise RuntimeError("aborted")

    class Broken(grpc.RpcError):
        pass

    def reading(request, context):
        raise Broken()
        yield b""

    context, seen = Context(), []
    with pytest.raises(RuntimeError, match="aborted"):
        list(_streaming(reading, seen.append)(iter(()), context))
    assert context.aborted[0] == grpc.StatusCode.CANCELLED and seen == [grpc.StatusCode.CANCELLED]
    assert "internal error" not in caplog.text


@pytest.mark.parametrize("dialect", ["duckdb", "snowflake"])
def test_a_text_of_comments_alone_is_refused_as_holding_no_statement(uri, dialect):
    with quail.connect(uri, dialect=dialect) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*the text holds no SQL statement"):
            cur.execute("-- * FROM (SELECT 1)")
