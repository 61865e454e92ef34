"""A second client (pyarrow.flight): statements by CommandStatementQuery, catalog schemas exactly as the spec."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from quail.server import sql_messages as sql

UTF8 = pa.utf8()
SPEC = {
    "CommandGetCatalogs": pa.schema([pa.field("catalog_name", UTF8, False)]),
    "CommandGetDbSchemas": pa.schema([pa.field("catalog_name", UTF8), pa.field("db_schema_name", UTF8, False)]),
    "CommandGetTableTypes": pa.schema([pa.field("table_type", UTF8, False)]),
    "CommandGetTables": pa.schema([pa.field("catalog_name", UTF8), pa.field("db_schema_name", UTF8),
                                   pa.field("table_name", UTF8, False), pa.field("table_type", UTF8, False)]),
}


@pytest.fixture(scope="module")
def client(server):
    c = flight.FlightClient(server.uri)
    writer, reader = c.do_put(
        flight.FlightDescriptor.for_command(sql.pack(sql.new(
            "CommandStatementIngest", table="things", table_definition_options=sql.new(
                "TableDefinitionOptions", if_not_exist=sql.TABLE_NOT_EXIST_CREATE, if_exists=sql.TABLE_EXISTS_FAIL)))),
        pa.schema([("x", pa.int32())]))
    writer.write_table(pa.table({"x": pa.array([1, 2], pa.int32())}))
    writer.done_writing()
    result = sql.new("DoPutUpdateResult")
    result.ParseFromString(reader.read().to_pybytes())
    writer.close()
    assert result.record_count == 2
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
