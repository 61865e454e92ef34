"""Arrow Flight protobuf messages (package arrow.flight.protocol), declared from the spec."""

from __future__ import annotations

from google.protobuf.message import DecodeError, Message

from quail.engine.errors import InvalidArgument

from quail.server.protobuf import build_messages

SERVICE = "arrow.flight.protocol.FlightService"
DESCRIPTOR_PATH, DESCRIPTOR_CMD = 1, 2
CANCEL_STATUS_UNSPECIFIED, CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING, CANCEL_STATUS_NOT_CANCELLABLE = 0, 1, 2, 3
OPTION_INVALID_NAME, OPTION_INVALID_VALUE = 1, 2
SESSION_CLOSED = 1

_SPECS = {
    "HandshakeRequest": [("protocol_version", 1, "uint64", ""), ("payload", 2, "bytes", "")],
    "HandshakeResponse": [("protocol_version", 1, "uint64", ""), ("payload", 2, "bytes", "")],
    "BasicAuth": [("username", 2, "string", ""), ("password", 3, "string", "")],
    "Empty": [],
    "ActionType": [("type", 1, "string", ""), ("description", 2, "string", "")],
    "Criteria": [("expression", 1, "bytes", "")],
    "Action": [("type", 1, "string", ""), ("body", 2, "bytes", "")],
    "Result": [("body", 1, "bytes", "")],
    "SchemaResult": [("schema", 1, "bytes", "")],
    "FlightDescriptor": [("type", 1, "int32", ""), ("cmd", 2, "bytes", ""), ("path", 3, "string", "repeated")],
    "FlightInfo": [
        ("schema", 1, "bytes", ""),
        ("flight_descriptor", 2, ".FlightDescriptor", ""),
        ("endpoint", 3, ".FlightEndpoint", "repeated"),
        ("total_records", 4, "int64", ""),
        ("total_bytes", 5, "int64", ""),
        ("ordered", 6, "bool", ""),
        ("app_metadata", 7, "bytes", ""),
    ],
    "PollInfo": [("info", 1, ".FlightInfo", ""), ("flight_descriptor", 2, ".FlightDescriptor", ""),
                 ("progress", 3, "double", "optional")],
    "CancelFlightInfoRequest": [("info", 1, ".FlightInfo", "")],
    "CancelFlightInfoResult": [("status", 1, "int32", "")],
    "Ticket": [("ticket", 1, "bytes", "")],
    "Location": [("uri", 1, "string", "")],
    "FlightEndpoint": [("ticket", 1, ".Ticket", ""), ("location", 2, ".Location", "repeated"),
                       ("app_metadata", 4, "bytes", "")],
    "FlightData": [
        ("flight_descriptor", 1, ".FlightDescriptor", ""),
        ("data_header", 2, "bytes", ""),
        ("app_metadata", 3, "bytes", ""),
        ("data_body", 1000, "bytes", ""),
    ],
    "PutResult": [("app_metadata", 1, "bytes", "")],
    # Session options. The value's oneof members are declared optional (the same wire format, with
    # presence); a map<K, V> is declared as its wire form, repeated entries of key = 1, value = 2.
    "SessionOptionValue": [("string_value", 1, "string", "optional"), ("bool_value", 2, "bool", "optional"),
                           ("int64_value", 3, "sfixed64", "optional"), ("double_value", 4, "double", "optional"),
                           ("string_list_value", 5, ".StringListValue", "")],
    "StringListValue": [("values", 1, "string", "repeated")],
    "SessionOptionEntry": [("key", 1, "string", ""), ("value", 2, ".SessionOptionValue", "")],
    "SetSessionOptionsRequest": [("session_options", 1, ".SessionOptionEntry", "repeated")],
    "SessionOptionError": [("value", 1, "int32", "")],
    "SessionOptionErrorEntry": [("key", 1, "string", ""), ("value", 2, ".SessionOptionError", "")],
    "SetSessionOptionsResult": [("errors", 1, ".SessionOptionErrorEntry", "repeated")],
    "GetSessionOptionsResult": [("session_options", 1, ".SessionOptionEntry", "repeated")],
    "CloseSessionResult": [("status", 1, "int32", "")],
}

FLIGHT = build_messages("arrow.flight.protocol", _SPECS, nested={"StringListValue": "SessionOptionValue"})


def parse(name: str, data: bytes) -> Message:
    """A Flight message from its bytes; InvalidArgument when they are not one."""
    message = FLIGHT[name]()
    try:
        message.ParseFromString(data)
    except DecodeError:
        raise InvalidArgument(f"the request is not a valid {name} message") from None
    return message
