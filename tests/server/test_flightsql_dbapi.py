"""An independent client, flightsql-dbapi, against a real server with logins: every RPC it has."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flightsql import FlightSQLClient, TableRef, connect

from quail.clients.server_process import ServerProcess

from flight_spec import SPEC

NOTES = [(1, "Fresh bread and a strong espresso for breakfast."), (2, "The train was forty minutes late."),
         (3, "A bowl of ramen with a soft egg."), (4, "The printer jammed twice this morning.")]
FOOD = "SELECT id FROM notes WHERE AI_FILTER(PROMPT('Is this text about food? {0}', body)) ORDER BY id"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("dbapi")
    users = root / "users"
    users.write_text("ann:s3cret:write\n")
    with ServerProcess(root / "data", "--users", str(users)) as server:
        yield server


def client_for(server: ServerProcess, password: str = "s3cret") -> FlightSQLClient:
    host, port = server.uri.removeprefix("grpc://").rsplit(":", 1)
    return FlightSQLClient(host=host, port=int(port), user="ann", password=password, insecure=True)


@pytest.fixture(scope="module")
def client(secured):
    c = client_for(secured)
    assert c.execute_update("CREATE TABLE notes (id BIGINT, body VARCHAR)") == 0
    values = ", ".join(f"({i}, '{body}')" for i, body in NOTES)
    assert c.execute_update(f"INSERT INTO notes VALUES {values}") == len(NOTES)
    yield c
    c.close()


def rows(c: FlightSQLClient, info: flight.FlightInfo) -> pa.Table:
    return c.do_get(info.endpoints[0].ticket).read_all()


def test_wrong_password_is_unauthenticated(secured):
    with pytest.raises(flight.FlightUnauthenticatedError):
        client_for(secured, password="wrong")


def test_metadata_schemas_equal_the_spec(client):
    notes = TableRef(table="notes")
    calls = {
        "CommandGetCatalogs": client.get_catalogs(),
        "CommandGetDbSchemas": client.get_db_schemas(),
        "CommandGetTables": client.get_tables(),
        "CommandGetTableTypes": client.get_table_types(),
        "CommandGetPrimaryKeys": client.get_primary_keys(notes),
        "CommandGetImportedKeys": client.get_imported_keys(notes),
        "CommandGetExportedKeys": client.get_exported_keys(notes),
        "CommandGetCrossReference": client.get_cross_reference(notes, notes),
        "CommandGetXdbcTypeInfo": client.get_xdbc_type_info(None),
    }
    for name, info in calls.items():
        table = rows(client, info)
        assert info.schema.equals(SPEC[name]) and table.schema.equals(SPEC[name]), name
    assert "notes" in rows(client, client.get_tables()).column("table_name").to_pylist()


def test_dbapi_metadata_helpers(client):
    conn = connect(client)
    assert "notes" in conn.flightsql_get_table_names()
    assert conn.flightsql_get_schema_names() == ["main"]
    assert [c["name"] for c in conn.flightsql_get_columns("notes")] == ["id", "body"]
    assert conn.flightsql_get_sql_info([0])[0] == "Quail"
    assert conn.flightsql_get_primary_keys("notes") == [] and conn.flightsql_get_foreign_keys("notes") == []


def test_ai_query_rows_equal_the_in_process_api(client, runtime):
    import quail

    local = quail.Session(runtime=runtime)
    local.register("notes", pa.table({"id": [i for i, _ in NOTES], "body": [b for _, b in NOTES]}))
    want = [(row["id"],) for row in local.sql(FOOD).run().collect().to_pylist()]
    with connect(client).cursor() as cur:
        cur.execute(FOOD)
        assert [tuple(r) for r in cur.fetchall()] == want
        assert [d[0] for d in cur.description] == ["id"]


def test_prepared_statements_with_bound_parameters(client):
    with connect(client).cursor() as cur:
        cur.execute("SELECT body FROM notes WHERE id = ? OR body = ? ORDER BY id", [2, NOTES[3][1]])
        assert [tuple(r) for r in cur.fetchall()] == [(NOTES[1][1],), (NOTES[3][1],)]
    with client.prepare("SELECT count(*) AS n FROM notes WHERE id > ?") as statement:
        binding = pa.record_batch([pa.array([1], pa.int64())], names=["p"])
        assert rows(client, statement.execute(binding)).to_pylist() == [{"n": 3}]


def test_create_as_insert_select_and_drop_count_rows(client):
    assert client.execute_update("CREATE TABLE late AS SELECT * FROM notes WHERE body LIKE '%late%'") == 1
    assert client.execute_update("INSERT INTO late SELECT * FROM notes WHERE id > 2") == 2
    assert rows(client, client.execute("SELECT id FROM late ORDER BY id")).column("id").to_pylist() == [2, 3, 4]
    assert client.execute_update("DROP TABLE late") == 0
    with pytest.raises(pa.ArrowKeyError, match="not found.*does not exist"):  # NOT_FOUND
        client.execute("SELECT * FROM late")


def test_bad_sql_is_invalid_argument_with_its_position(client):
    with pytest.raises(pa.ArrowInvalid, match="(?i)line 1"):
        client.execute("SELECT id FROM notes WHERE")


def test_running_queries_name_their_user(client):
    watch = "SELECT user_name, query, tokens_planned FROM quail_queries"
    assert rows(client, client.execute(watch)).to_pylist() == [{"user_name": "ann", "query": watch,
                                                                 "tokens_planned": 0}]
