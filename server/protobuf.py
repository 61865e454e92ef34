"""Builds protobuf message classes at import time from compact field tables.

A table maps a message name to (field name, number, type, label) tuples. Type
is a scalar name ("string", "bytes", "bool", "int32", "int64", "uint32",
"uint64", "sfixed64", "double") or ".Name" for another message of the same table; label is
"" (singular), "optional" (proto3 optional, with presence) or "repeated".
Enum-typed fields are declared int32: the same varint on the wire.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

FieldSpec = tuple[str, int, str, str]
_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "bool": _F.TYPE_BOOL, "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64, "double": _F.TYPE_DOUBLE,
    "sfixed64": _F.TYPE_SFIXED64,
}


def _full_name(package: str, name: str, nested: dict[str, str]) -> str:
    return f"{package}.{nested[name]}.{name}" if name in nested else f"{package}.{name}"


def _message_proto(package: str, name: str, specs: dict[str, list[FieldSpec]],
                   nested: dict[str, str]) -> descriptor_pb2.DescriptorProto:
    proto = descriptor_pb2.DescriptorProto(name=name)
    for field_name, number, kind, label in specs[name]:
        field = proto.field.add(name=field_name, number=number, json_name=field_name)
        if kind.startswith("."):
            field.type = _F.TYPE_MESSAGE
            field.type_name = "." + _full_name(package, kind[1:], nested)
        else:
            field.type = _SCALARS[kind]
        field.label = _F.LABEL_REPEATED if label == "repeated" else _F.LABEL_OPTIONAL
        if label == "optional":
            field.proto3_optional = True
            field.oneof_index = len(proto.oneof_decl)
            proto.oneof_decl.add(name=f"_{field_name}")
    for child, parent in nested.items():
        if parent == name:
            proto.nested_type.append(_message_proto(package, child, specs, nested))
    return proto


def build_messages(package: str, specs: dict[str, list[FieldSpec]],
                   nested: dict[str, str] | None = None) -> dict[str, type[Message]]:
    """Message classes by name; `nested` maps a nested message's name to its parent's."""
    nested = nested or {}
    file = descriptor_pb2.FileDescriptorProto(name=f"quail/{package}.proto", package=package, syntax="proto3")
    for name in specs:
        if name not in nested:
            file.message_type.append(_message_proto(package, name, specs, nested))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(_full_name(package, name, nested)))
            for name in specs}
