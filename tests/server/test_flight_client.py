"""A second client (pyarrow.flight): statements by CommandStatementQuery, catalog schemas exactly as the spec."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from quail.server import sql_messages as sql

from flight_spec import SPEC


def ingest(client: flight.FlightClient, name: str, table: pa.Table, if_exists: int) -> int:
    """DoPut(CommandStatementIngest): the rows the server says it wrote."""
    writer, reader = client.do_put(
        flight.FlightDescriptor.for_command(sql.pack(sql.new(
            "CommandStatementIngest", table=name, table_definition_options=sql.new(
                "TableDefinitionOptions", if_not_exist=sql.TABLE_NOT_EXIST_CREATE, if_exists=if_exists)))),
        table.schema)
    writer.write_table(table)
    writer.done_writing()
    result = sql.new("DoPutUpdateResult")
    result.ParseFromString(reader.read().to_pybytes())
    writer.close()
    return result.record_count


@pytest.fixture(scope="module")
def client(server):
    c = flight.FlightClient(server.uri)
    assert ingest(c, "things", pa.table({"x": pa.array([1, 2], pa.int32())}), sql.TABLE_EXISTS_FAIL) == 2
    yield c
    c.close()


def fetch(client, message) -> tuple[pa.Schema, pa.Table]:
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.pack(message)))
    table = client.do_get(info.endpoints[0].ticket).read_all()
    return info.schema, table


@pytest.mark.parametrize("name", sorted(SPEC))
def test_schema_equals_the_spec(client, name):
    announced, table = fetch(client, sql.new(name))
    assert announced.equals(SPEC[name]) and table.schema.equals(SPEC[name])


def test_tables_with_schema_and_filters(client):
    announced, table = fetch(client, sql.new("CommandGetTables", include_schema=True, table_name_filter_pattern="th%"))
    expected = SPEC["CommandGetTables"].append(pa.field("table_schema", pa.binary(), False))
    assert announced.equals(expected) and table.schema.equals(expected)
    assert table["table_name"].to_pylist() == ["things"]
    assert pa.ipc.read_schema(pa.py_buffer(table["table_schema"][0].as_py())) == pa.schema([("x", pa.int32())])
    _, none = fetch(client, sql.new("CommandGetTables", catalog="elsewhere"))
    assert none.num_rows == 0


def test_sql_info(client):
    _, table = fetch(client, sql.new("CommandGetSqlInfo", info=[0, 3, 4, 10, 504]))
    assert table.schema.field("info_name") == pa.field("info_name", pa.uint32(), False)
    assert dict(zip(table["info_name"].to_pylist(), table["value"].to_pylist())) == {
        0: "Quail", 3: False, 4: True, 10: True, 504: '"'}
    _, keywords = fetch(client, sql.new("CommandGetSqlInfo", info=[508]))
    listed = keywords["value"][0].as_py()
    assert {"AI_FILTER", "AI_CLASSIFY", "AI_SCORE", "PROMPT", "QUALIFY", "PIVOT", "ILIKE"} <= set(listed)
    assert not {"SELECT", "WHERE", "JOIN"} & set(listed), "SQL-92's own keywords are not listed"


def test_unknown_command_is_unimplemented(client):
    with pytest.raises(pa.ArrowNotImplementedError) as err:
        client.get_flight_info(flight.FlightDescriptor.for_command(b"not a command"))
    assert "unsupported command" in str(err.value)


def test_statement_query_and_get_schema(client):
    descriptor = flight.FlightDescriptor.for_command(sql.pack(sql.new(
        "CommandStatementQuery", query="SELECT x * 2 AS y FROM things ORDER BY y")))
    assert client.get_schema(descriptor).schema == pa.schema([("y", pa.int32())])
    info = client.get_flight_info(descriptor)
    assert client.do_get(info.endpoints[0].ticket).read_all().to_pydict() == {"y": [2, 4]}
    with pytest.raises(pa.ArrowKeyError, match="already redeemed"):
        client.do_get(info.endpoints[0].ticket).read_all()


def test_handshake_without_credentials(client):
    class NoCredentials(flight.ClientAuthHandler):
        def authenticate(self, outgoing, incoming):
            outgoing.write(b"")
            incoming.read()

        def get_token(self):
            return b""

    client.authenticate(NoCredentials())
    assert fetch(client, sql.new("CommandGetCatalogs"))[1].num_rows == 1


def test_type_info_lists_the_result_types_ordered_and_filtered(client):
    _, table = fetch(client, sql.new("CommandGetXdbcTypeInfo"))
    codes = table.column("data_type").to_pylist()
    assert codes == sorted(codes) and {"VARCHAR", "BIGINT", "DOUBLE", "BOOLEAN", "TIMESTAMP"} <= set(
        table.column("type_name").to_pylist())
    _, varchar = fetch(client, sql.new("CommandGetXdbcTypeInfo", data_type=12))
    assert varchar.column("type_name").to_pylist() == ["VARCHAR"]


def test_prepared_update_as_jdbc_runs_it(client):
    """JDBC prepares every statement; an empty dataset schema marks an update, run by
    DoPut(CommandPreparedStatementUpdate) and answered with the rows it wrote."""
    body = sql.pack(sql.new("ActionCreatePreparedStatementRequest",
                            query="CREATE TABLE copied AS SELECT x FROM things WHERE x > 1"))
    (result,) = client.do_action(flight.Action("CreatePreparedStatement", body))
    _, prepared = sql.unpack(result.body.to_pybytes())
    assert pa.ipc.read_schema(pa.py_buffer(prepared.dataset_schema)).names == []
    command = sql.new("CommandPreparedStatementUpdate", prepared_statement_handle=prepared.prepared_statement_handle)
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(sql.pack(command)), pa.schema([]))
    writer.done_writing()
    written = sql.new("DoPutUpdateResult")
    written.ParseFromString(reader.read().to_pybytes())
    writer.close()
    assert written.record_count == 1
    _, table = fetch(client, sql.new("CommandStatementQuery", query="SELECT x FROM copied"))
    assert table.column("x").to_pylist() == [2]


def test_large_results_stream_in_batches(client):
    """A result of a million rows leaves in batches as DuckDB produces them, every row once."""
    ingest(client, "numbers", pa.table({"i": pa.array(range(1_000_000), pa.int64())}), sql.TABLE_EXISTS_REPLACE)
    query = "SELECT i, i % 7 AS r FROM numbers"
    info = client.get_flight_info(flight.FlightDescriptor.for_command(
        sql.pack(sql.new("CommandStatementQuery", query=query))))
    reader = client.do_get(info.endpoints[0].ticket)
    first = reader.read_chunk().data
    assert 0 < first.num_rows < 1_000_000, "the first batch comes alone"
    rest = reader.read_all()
    assert first.num_rows + rest.num_rows == 1_000_000
    assert pa.compute.sum(rest.column("i")).as_py() + pa.compute.sum(first.column("i")).as_py() == 999_999 * 500_000
