"""Flight SQL protobuf messages (package arrow.flight.protocol.sql), declared from the spec.

Wrapped in `google.protobuf.Any`, commands travel with type URLs
`type.googleapis.com/arrow.flight.protocol.sql.<Message>`.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from quail.server.protobuf import build_messages

PACKAGE = "arrow.flight.protocol.sql"
TYPE_URL_PREFIX = f"type.googleapis.com/{PACKAGE}."

_MESSAGES = {
    "CommandGetSqlInfo": [("info", 1, "uint32", "repeated")],
    "CommandGetXdbcTypeInfo": [("data_type", 1, "int32", "optional")],
    "CommandGetCatalogs": [],
    "CommandGetDbSchemas": [("catalog", 1, "string", "optional"), ("db_schema_filter_pattern", 2, "string", "optional")],
    "CommandGetTables": [
        ("catalog", 1, "string", "optional"),
        ("db_schema_filter_pattern", 2, "string", "optional"),
        ("table_name_filter_pattern", 3, "string", "optional"),
        ("table_types", 4, "string", "repeated"),
        ("include_schema", 5, "bool", ""),
    ],
    "CommandGetTableTypes": [],
    "CommandGetPrimaryKeys": [("catalog", 1, "string", "optional"), ("db_schema", 2, "string", "optional"),
                              ("table", 3, "string", "")],
    "CommandGetImportedKeys": [("catalog", 1, "string", "optional"), ("db_schema", 2, "string", "optional"),
                               ("table", 3, "string", "")],
    "CommandGetExportedKeys": [("catalog", 1, "string", "optional"), ("db_schema", 2, "string", "optional"),
                               ("table", 3, "string", "")],
    "CommandGetCrossReference": [("pk_catalog", 1, "string", "optional"), ("pk_db_schema", 2, "string", "optional"),
                                 ("pk_table", 3, "string", ""), ("fk_catalog", 4, "string", "optional"),
                                 ("fk_db_schema", 5, "string", "optional"), ("fk_table", 6, "string", "")],
    "ActionCreatePreparedStatementRequest": [("query", 1, "string", ""), ("transaction_id", 2, "bytes", "optional")],
    "ActionCreatePreparedStatementResult": [
        ("prepared_statement_handle", 1, "bytes", ""),
        ("dataset_schema", 2, "bytes", ""),
        ("parameter_schema", 3, "bytes", ""),
    ],
    "ActionClosePreparedStatementRequest": [("prepared_statement_handle", 1, "bytes", "")],
    "ActionCancelQueryRequest": [("info", 1, "bytes", "")],
    "ActionCancelQueryResult": [("result", 1, "int32", "")],
    "CommandStatementQuery": [("query", 1, "string", ""), ("transaction_id", 2, "bytes", "optional")],
    "SubstraitPlan": [("plan", 1, "bytes", ""), ("version", 2, "string", "")],
    "CommandStatementSubstraitPlan": [("plan", 1, ".SubstraitPlan", ""), ("transaction_id", 2, "bytes", "optional")],
    "TicketStatementQuery": [("statement_handle", 1, "bytes", "")],
    "CommandPreparedStatementQuery": [("prepared_statement_handle", 1, "bytes", "")],
    "CommandStatementUpdate": [("query", 1, "string", ""), ("transaction_id", 2, "bytes", "optional")],
    "CommandPreparedStatementUpdate": [("prepared_statement_handle", 1, "bytes", "")],
    "TableDefinitionOptions": [("if_not_exist", 1, "int32", ""), ("if_exists", 2, "int32", "")],
    "CommandStatementIngest": [
        ("table_definition_options", 1, ".TableDefinitionOptions", ""),
        ("table", 2, "string", ""),
        ("schema", 3, "string", "optional"),
        ("catalog", 4, "string", "optional"),
        ("temporary", 5, "bool", ""),
        ("transaction_id", 6, "bytes", "optional"),
    ],
    "DoPutUpdateResult": [("record_count", 1, "int64", "")],
    "ActionBeginTransactionRequest": [],
    "ActionBeginTransactionResult": [("transaction_id", 1, "bytes", "")],
    "ActionEndTransactionRequest": [("transaction_id", 1, "bytes", ""), ("action", 2, "int32", "")],
    "DoPutPreparedStatementResult": [("prepared_statement_handle", 1, "bytes", "optional")],
}
# Messages the spec nests inside another (full name = parent.name).
_NESTED = {"TableDefinitionOptions": "CommandStatementIngest"}

# ActionEndTransactionRequest.EndTransaction.
END_TRANSACTION_UNSPECIFIED, END_TRANSACTION_COMMIT, END_TRANSACTION_ROLLBACK = 0, 1, 2
# CommandStatementIngest.TableDefinitionOptions enums.
TABLE_NOT_EXIST_UNSPECIFIED, TABLE_NOT_EXIST_CREATE, TABLE_NOT_EXIST_FAIL = 0, 1, 2
TABLE_EXISTS_UNSPECIFIED, TABLE_EXISTS_FAIL, TABLE_EXISTS_APPEND, TABLE_EXISTS_REPLACE = 0, 1, 2, 3


SQL = build_messages(PACKAGE, _MESSAGES, _NESTED)


def pack(message: Message) -> bytes:
    """Serialize a message wrapped in google.protobuf.Any."""
    wrapper = any_pb2.Any(type_url=TYPE_URL_PREFIX + message.DESCRIPTOR.name, value=message.SerializeToString())
    return wrapper.SerializeToString()


def unpack(data: bytes) -> tuple[str, Message | None]:
    """(message name, message) of a Flight SQL command inside an Any.

    The name is "" when the bytes are no Any of this package; the message is
    None when the name is not one this server declares or the body is broken.
    """
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(data)
    except DecodeError:
        return "", None
    if not wrapper.type_url.startswith(TYPE_URL_PREFIX):
        return "", None
    name = wrapper.type_url[len(TYPE_URL_PREFIX):]
    cls = SQL.get(name)
    if cls is None:
        return name, None
    message = cls()
    try:
        message.ParseFromString(wrapper.value)
    except DecodeError:
        return name, None
    return name, message


def optional(message: Message, field: str) -> Any:
    """An optional field's value, None when unset."""
    return getattr(message, field) if message.HasField(field) else None


def transaction(message: Message) -> bytes | None:
    """The transaction a command or request names (None: none, or an empty id)."""
    return optional(message, "transaction_id") or None


def new(name: str, **fields) -> Message:
    """A message by its spec name."""
    return SQL[name](**fields)
