"""Arrow Flight protobuf messages (package arrow.flight.protocol), declared from the spec."""

from __future__ import annotations

from .protobuf import build_messages

SERVICE = "arrow.flight.protocol.FlightService"
DESCRIPTOR_PATH, DESCRIPTOR_CMD = 1, 2
CANCEL_STATUS_UNSPECIFIED, CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING, CANCEL_STATUS_NOT_CANCELLABLE = 0, 1, 2, 3

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
}

FLIGHT = build_messages("arrow.flight.protocol", _SPECS)
