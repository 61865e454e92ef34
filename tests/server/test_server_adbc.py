"""A real `quail serve` process driven through the real ADBC Flight SQL driver."""

from __future__ import annotations

import json
import re

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa
import pytest

import quail
from quail.clients.server_process import ServerProcess
from quail.engine.ai.asking import Question, build_requests
from quail.remote import set_session_options
from tests.sample_tables import SUBJECTS, TELL, TELL_TOKENS

REVIEWS = pa.table({
    "id": [1, 2, 3, 4, 5, 6],
    "body": [
        "The pasta was cold and the waiter was rude.",
        "Best tiramisu in town, lovely staff!",
        "The ending of the film surprised everyone.",
        "Delivery was late and the box was crushed.",
        "Spotless room, quiet garden, great breakfast.",
        None,
    ],
    "stars": [1, 5, 4, 1, 5, 3],
})
QUESTION = "Is {0} a positive review?"


def connect(uri: str):
    return flight_sql.connect(uri, autocommit=True)


@pytest.fixture(scope="module")
def conn(server):
    with connect(server.uri) as c:
        with c.cursor() as cur:
            assert cur.adbc_ingest("reviews", REVIEWS, mode="create") == REVIEWS.num_rows
        yield c


def query(conn, sql: str, parameters=None) -> pa.Table:
    with conn.cursor() as cur:
        cur.execute(sql, parameters)
        return cur.fetch_arrow_table()


def test_get_objects_and_table_schema(conn):
    objects = conn.adbc_get_objects().read_all().to_pylist()
    assert [c["catalog_name"] for c in objects] == ["quail"]
    schemas = objects[0]["catalog_db_schemas"]
    assert [s["db_schema_name"] for s in schemas] == ["main"]
    tables = {t["table_name"]: t for t in schemas[0]["db_schema_tables"]}
    assert [c["column_name"] for c in tables["reviews"]["table_columns"]] == ["id", "body", "stars"]
    assert conn.adbc_get_table_schema("reviews") == REVIEWS.schema
    assert conn.adbc_get_table_types() == ["SYSTEM TABLE", "TABLE", "VIEW"]
    info = conn.adbc_get_info()
    assert info["vendor_name"] == "Quail" and info["vendor_version"]


def test_plain_sql_runs_in_duckdb(conn):
    table = query(conn, "SELECT stars, count(*) AS n FROM reviews GROUP BY stars ORDER BY stars DESC")
    assert table.to_pylist() == [{"stars": 5, "n": 2}, {"stars": 4, "n": 1}, {"stars": 3, "n": 1},
                                 {"stars": 1, "n": 2}]


def test_prepared_query_with_a_parameter(conn):
    assert query(conn, "SELECT id, body FROM reviews WHERE stars = ? ORDER BY id", (4,)).to_pylist() == [
        {"id": 3, "body": "The ending of the film surprised everyone."}]
    assert query(conn, "SELECT id FROM reviews WHERE stars = ? ORDER BY id", (5,))["id"].to_pylist() == [2, 5]


def test_ai_filter_matches_hf_scoring_of_the_same_prompts(conn, runtime, hf_p_yes):
    got = query(conn, "SELECT id FROM reviews r WHERE r.stars >= 4 "
                      f"AND AI_FILTER(PROMPT('{QUESTION}', r.body)) ORDER BY id")["id"].to_pylist()
    candidates = [row for row in REVIEWS.to_pylist() if row["stars"] >= 4 and row["body"] is not None]
    requests = build_requests(runtime, Question(QUESTION), [[row["body"]] for row in candidates])
    expected = [row["id"] for row, request in zip(candidates, requests) if hf_p_yes(request) > 0.5]
    assert got == expected


def test_bigquery_ai_if_and_full_sql_around_the_filter(tmp_path):
    with ServerProcess(tmp_path, "--dialect", "bigquery") as bq, connect(bq.uri) as c:
        with c.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS, mode="create")
        table = query(c, "SELECT count(*) AS n FROM reviews WHERE AI.IF(('Is this review positive? ', body))")
        assert table.num_rows == 1 and 0 <= table["n"][0].as_py() <= 5


@pytest.mark.parametrize("sql, status, fragment", [
    ("SELECT * FRM reviews WHERE", "INVALID_ARGUMENT", "line 1, column"),
    ("SELECT * FROM no_such_table", "NOT_FOUND", "no_such_table"),
    ("SELECT no_such_column FROM reviews", "INVALID_ARGUMENT", "no_such_column"),
    ("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{0} vs {1}', body))", "INVALID_ARGUMENT", "{1}"),
    ("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('plain', body))", "INVALID_ARGUMENT", "placeholder"),
])
def test_bad_input_gets_a_clear_status_and_the_server_keeps_answering(conn, sql, status, fragment):
    with pytest.raises(adbc_driver_manager.Error) as err:
        query(conn, sql)
    message = str(err.value)
    assert message.startswith(status), message
    assert fragment in message and "Traceback" not in message
    assert query(conn, "SELECT count(*) AS n FROM reviews")["n"].to_pylist() == [6]


def test_ingest_modes(conn):
    rows = pa.table({"k": [1, 2]})
    with conn.cursor() as cur:
        cur.adbc_ingest("modes", rows, mode="create")
        with pytest.raises(adbc_driver_manager.Error, match="ALREADY_EXISTS"):
            cur.adbc_ingest("modes", rows, mode="create")
        cur.adbc_ingest("modes", rows, mode="append")
        assert query(conn, "SELECT sum(k) AS s FROM modes")["s"].to_pylist() == [6]
        cur.adbc_ingest("modes", pa.table({"k": [10]}), mode="replace")
        assert query(conn, "SELECT sum(k) AS s FROM modes")["s"].to_pylist() == [10]
        cur.adbc_ingest("modes", rows, mode="create_append")
        assert query(conn, "SELECT count(*) AS n FROM modes")["n"].to_pylist() == [3]
        with pytest.raises(adbc_driver_manager.Error, match="NOT_FOUND"):
            cur.adbc_ingest("missing_table", rows, mode="append")


def test_a_prepared_query_is_planned_again_when_a_table_changes_before_it_runs(server, conn):
    """The plan a query got when it was prepared runs it only while the tables have not changed: one
    replaced in between (by another connection) gives the new table's columns and rows."""
    with conn.cursor() as cur:
        cur.adbc_ingest("swap", pa.table({"a": [1]}), mode="create")
        cur.adbc_prepare("SELECT * FROM swap")
        with connect(server.uri) as other, other.cursor() as writer:
            writer.adbc_ingest("swap", pa.table({"b": ["x", "y"]}), mode="replace")
        cur.execute("SELECT * FROM swap")
        assert cur.fetch_arrow_table().to_pylist() == [{"b": "x"}, {"b": "y"}]
        cur.execute("SELECT * FROM swap")
        assert cur.fetch_arrow_table().to_pylist() == [{"b": "x"}, {"b": "y"}]


def test_restart_serves_the_same_rows(tmp_path):
    table = pa.table({"id": list(range(100)), "text": [f"row {i}" for i in range(100)]})
    with ServerProcess(tmp_path) as first, connect(first.uri) as c, c.cursor() as cur:
        cur.adbc_ingest("kept", table, mode="create")
        cur.adbc_ingest("kept", table.slice(0, 10), mode="append")
        before = query(c, "SELECT * FROM kept")
    assert first.process.returncode == 0, "SIGTERM stops the server cleanly"
    with ServerProcess(tmp_path) as second, connect(second.uri) as c:
        assert query(c, "SELECT * FROM kept").equals(before)
        assert before.num_rows == 110


def test_dialect_is_a_session_option(server, conn):
    """SetSessionOptions (ADBC: a connection option) picks the SQL dialect of one session only."""
    cookies = {"adbc.flight.sql.rpc.with_cookie_middleware": "true"}
    with flight_sql.connect(server.uri, db_kwargs=cookies, autocommit=True) as bq, connect(server.uri) as default:
        set_session_options(bq, dialect="bigquery")
        options = bq.adbc_connection.get_option("adbc.flight.sql.session.options")
        assert '"dialect":"bigquery"' in options.replace(" ", "")
        backticks = "SELECT `id` AS x FROM reviews WHERE id = 1"  # BigQuery quoting, a syntax error in Snowflake
        assert query(bq, backticks).to_pylist() == [{"x": 1}]
        with pytest.raises(adbc_driver_manager.ProgrammingError, match="INVALID_ARGUMENT"):
            query(default, backticks)  # the server default stays snowflake
        with pytest.raises(adbc_driver_manager.Error, match="dialect"):
            bq.adbc_connection.set_options(**{"adbc.flight.sql.session.option.dialect": "klingon"})
        assert query(bq, backticks).to_pylist() == [{"x": 1}]


def test_a_client_reads_back_that_its_session_holds(server):
    """`quail.session` is "open" only to a call that came with its session's cookie, and cannot be set; a
    client whose cookie does not come back (here: cookies off) is told so instead of running in the
    server's default dialect."""
    options = "adbc.flight.sql.session.options"
    with quail.connect(server.uri, dialect="duckdb") as kept, connect(server.uri) as cookieless:
        assert json.loads(kept.adbc_connection.get_option(options))["quail.session"] == "open"
        with pytest.raises(adbc_driver_manager.Error, match="quail.session"):
            kept.adbc_connection.set_options(**{"adbc.flight.sql.session.option.quail.session": "open"})
        with pytest.raises(ConnectionError, match="session cookie did not come back"):
            set_session_options(cookieless, dialect="duckdb")
        assert "quail.session" not in json.loads(cookieless.adbc_connection.get_option(options))


def test_explain_through_adbc(conn):
    table = query(conn, f"EXPLAIN SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{QUESTION}', body))")
    assert table.column_names == ["plan"] and any(line.startswith("AI filter") for line in table["plan"].to_pylist())


def test_explain_analyze_through_adbc(conn):
    lines = query(conn, f"EXPLAIN ANALYZE SELECT id FROM reviews WHERE stars > 1 AND "
                        f"AI_FILTER(PROMPT('{QUESTION}', body), {{'selectivity': 0.5}})")["plan"].to_pylist()
    assert any(line.startswith("AI filter") and " rows, " in line for line in lines)
    assert any(line.startswith("stage ai_filter") and "0.5 estimated" in line and "observed" in line for line in lines)
    assert lines[-2].startswith("model: ") and "KV regret" in lines[-2]
    assert lines[-1].startswith("wall ") and "speed of light" in lines[-1]


def test_explain_expects_the_documents_an_earlier_query_left_resident(conn):
    """Before any query read a table's texts, EXPLAIN expects none of its documents resident; after a filter
    over them, another question over the same column expects them all, and EXPLAIN ANALYZE shows them
    cached, and the work they spared this query's own ideal plan."""
    stays = pa.table({"id": [1, 2, 3], "note": ["The heating broke twice this winter.",
                                                 "Friendly staff at the front desk.", "Parking was hard to find."]})
    with conn.cursor() as cur:
        cur.adbc_ingest("stays", stays, mode="create")
    asked = "SELECT id FROM stays WHERE AI_FILTER(PROMPT('Is {0} a complaint?', note))"
    other = "SELECT id FROM stays WHERE AI_FILTER(PROMPT('Is {0} about staff?', note))"

    def plan(sql: str) -> list[str]:
        return query(conn, sql)["plan"].to_pylist()

    def ai_line(lines: list[str]) -> str:
        (line,) = [line for line in lines if line.startswith("AI filter")]
        return line

    def number(text: str) -> int:
        return int(text.replace(",", ""))

    def expected(sql: str) -> tuple[int, int]:
        found = re.search(r"expects ~([\d,]+) of ([\d,]+) document tokens resident", ai_line(plan("EXPLAIN " + sql)))
        return number(found.group(1)), number(found.group(2))

    resident, total = expected(asked)
    assert resident == 0 and total > 0
    query(conn, asked)
    resident, total = expected(other)
    assert total > 0 and resident >= 0.9 * total
    lines = plan("EXPLAIN ANALYZE " + other)
    analyzed = re.search(r"([\d,]+) of ([\d,]+) prompt tokens cached\]", ai_line(lines))
    assert analyzed is not None and number(analyzed.group(1)) > 0
    spared = re.search(r"ideal plan alone, ([\d,]+) fresh tokens, of which KV that earlier queries left spared "
                       r"([\d,]+)$", lines[-1])
    assert spared is not None and 0 < number(spared.group(2)) <= number(spared.group(1)), \
        "the speed of light is the query's own ideal plan's: the resident documents beat it"


@pytest.mark.parametrize("sql", [
    "SELECT r.id AS review, t.id AS topic FROM reviews r RIGHT JOIN topics t "
    "ON AI_FILTER(PROMPT('Is {0} about {1}?', r.body, t.topic)) ORDER BY 2, 1 NULLS LAST",
    "SELECT r.id AS review, t.id AS topic FROM reviews r FULL JOIN topics t "
    "ON r.stars > 1 AND AI_FILTER(PROMPT('Is {0} about {1}?', r.body, t.topic)) ORDER BY 1, 2 NULLS LAST",
    "SELECT id FROM reviews r WHERE NOT EXISTS (SELECT 1 FROM topics t "
    "WHERE AI_FILTER(PROMPT('Is {0} about {1}?', r.body, t.topic))) ORDER BY id",
], ids=["right-join", "full-join", "correlated-not-exists"])
def test_outer_joins_and_correlated_subqueries_through_adbc(conn, runtime, sql):
    """The server's rows equal the in-process API's over the same model and data."""
    import quail

    topics = pa.table({"id": [1, 2], "topic": ["food", "a film"]})
    with conn.cursor() as cur:
        cur.adbc_ingest("topics", topics, mode="replace")
    local = quail.Session(runtime=runtime)
    local.register("reviews", REVIEWS)
    local.register("topics", topics)
    assert query(conn, sql).to_pylist() == local.sql(sql).run().collect().to_pylist()


def test_create_insert_drop_through_adbc(conn, runtime):
    """CREATE TABLE ... AS (with an AI filter), INSERT INTO (query, VALUES, named columns), CREATE TABLE
    with columns, DROP TABLE: each one atomic commit, answered with the rows it wrote."""
    import quail

    ask = f"NOT AI_FILTER(PROMPT('{QUESTION}', body))"
    local = quail.Session(runtime=runtime)
    local.register("reviews", REVIEWS)
    want = local.sql(f"SELECT id, body FROM reviews WHERE {ask} ORDER BY id").run().collect()
    assert want.num_rows > 0
    created = query(conn, f"CREATE TABLE liked AS SELECT id, body FROM reviews WHERE {ask} ORDER BY id")
    assert created.to_pylist() == [{"rows_affected": want.num_rows}]
    assert query(conn, "SELECT * FROM liked ORDER BY id").to_pylist() == want.to_pylist()
    with conn.cursor() as cur:
        cur.adbc_statement.set_sql_query("INSERT INTO liked SELECT id, body FROM reviews WHERE stars = 1")
        assert cur.adbc_statement.execute_update() == 2, "DoPut(CommandStatementUpdate): the rows written"
    query(conn, "INSERT INTO liked (body, id) VALUES ('added by name', 100)")
    assert query(conn, "SELECT id FROM liked WHERE body = 'added by name'").to_pylist() == [{"id": 100}]
    assert query(conn, "CREATE TABLE IF NOT EXISTS liked AS SELECT 1 AS x").to_pylist() == [{"rows_affected": 0}]
    with pytest.raises(adbc_driver_manager.Error, match="already exists"):
        query(conn, "CREATE TABLE liked AS SELECT 1 AS x")
    query(conn, "CREATE TABLE notes (id BIGINT, note VARCHAR)")
    empty = query(conn, "SELECT * FROM notes")
    assert empty.num_rows == 0 and empty.schema.names == ["id", "note"]
    for table in ("liked", "notes"):
        assert query(conn, f"DROP TABLE {table}").to_pylist() == [{"rows_affected": 0}]
    assert {"liked", "notes"}.isdisjoint(t["table_name"] for t in conn.adbc_get_objects().read_all()
                                         .column("catalog_db_schemas")[0][0]["db_schema_tables"].as_py())
    with pytest.raises(adbc_driver_manager.Error, match="does not exist"):
        query(conn, "DROP TABLE liked")
    query(conn, "DROP TABLE IF EXISTS liked")


def test_ai_complete_on_a_server_whose_pool_holds_less_than_a_prompt(tmp_path, runtime, hf_generate):
    """--kv-cache-bytes of 40 tokens, fewer than one prompt: the resident tree cannot keep a prompt from its
    prefill to its decoding, so decoding computes it again; the answers are HF's, and the query ends with
    them (its report counts what decoding computed apart from the prompts: no negative count of cached
    tokens to fail it)."""
    from quail.engine.kv.pool import token_bytes

    cfg = runtime.config
    slot = token_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, runtime.runner.model.embed_tokens.weight.dtype)
    subjects = SUBJECTS[:3]
    requests = build_requests(runtime, Question(TELL, answers="text"), [[s] for s in subjects])
    expected = [runtime.tokenizer.decode(t) for t in hf_generate(requests, 6, runtime.end_of_turn)]
    with ServerProcess(tmp_path, "--kv-cache-bytes", str(40 * slot)) as served, connect(served.uri) as c:
        with c.cursor() as cur:
            cur.adbc_ingest("subjects", pa.table({"id": list(range(len(subjects))), "subject": subjects}))
        sql = f"SELECT id, AI_COMPLETE(PROMPT('{TELL}', subject), {{'max_tokens': 6}}) AS answer FROM subjects"
        assert query(c, sql + " ORDER BY id")["answer"].to_pylist() == expected


def test_ai_complete_gives_the_tokens_hf_generate_gives_batched_and_alone(conn, runtime, hf_generate):
    """32 prompts through ADBC, greedy: each answer is the text of the tokens HF transformers' `generate` gives
    on the same token ids (the prompt laid out as docs/prompt-layout.md says), all 32 in one query and, for
    four of them, one query each (tests/engine/test_generation.py runs each of the 32 alone)."""
    with conn.cursor() as cur:
        cur.adbc_ingest("subjects", pa.table({"id": list(range(len(SUBJECTS))), "subject": SUBJECTS}), mode="create")
    requests = build_requests(runtime, Question(TELL, answers="text"), [[s] for s in SUBJECTS])
    expected = [runtime.tokenizer.decode(t) for t in hf_generate(requests, TELL_TOKENS, runtime.end_of_turn)]
    sql = f"SELECT id, AI_COMPLETE(PROMPT('{TELL}', subject), {{'max_tokens': {TELL_TOKENS}}}) AS answer FROM subjects"
    assert query(conn, sql + " ORDER BY id")["answer"].to_pylist() == expected
    for k in range(0, len(SUBJECTS), 8):
        assert query(conn, f"{sql} WHERE id = {k}")["answer"].to_pylist() == [expected[k]]
