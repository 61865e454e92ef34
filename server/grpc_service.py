"""The Arrow Flight gRPC service on grpcio: wire decoding, error mapping, and dispatch to a handler.

Errors leave as a status code and a one-line message: Quail errors by their
class (status.py), anything unexpected as INTERNAL with a reference to the
server log, never with a stack trace.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from typing import Callable, Iterable, Iterator, Protocol

import grpc
import pyarrow as pa

from quail.engine.errors import InvalidArgument, QuailError, Unimplemented

from quail.server.auth import Authenticator
from quail.server.flight_messages import FLIGHT, SERVICE, parse
from quail.server.ipc import decode, encode, first_schema, schema_bytes
from quail.server.status import status_of

log = logging.getLogger("quail.server")
LOGGED_FRAMES = 12  # an internal error's innermost frames in the log (one entry, however deep the stack)


class FlightHandler(Protocol):
    """What the Flight SQL layer implements; messages are parsed Flight protobufs."""

    def get_flight_info(self, descriptor, context: grpc.ServicerContext): ...

    def get_schema(self, descriptor, context: grpc.ServicerContext) -> pa.Schema: ...

    def do_get(self, ticket, context: grpc.ServicerContext) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]: ...

    def reads_data(self, descriptor, schema: pa.Schema | None) -> bool:
        """Whether a DoPut of this descriptor, whose first message carries `schema` (None: no schema), carries
        data (else it is answered without waiting for its end)."""

    def do_put(self, descriptor, schema: pa.Schema, batches: list[pa.RecordBatch],
               context: grpc.ServicerContext) -> Iterable[bytes]: ...

    def do_action(self, action, context: grpc.ServicerContext) -> Iterable[bytes]: ...

    def list_actions(self) -> list[tuple[str, str]]: ...


OnError = Callable[[grpc.StatusCode], None]


def _abort(context: grpc.ServicerContext, exc: Exception, on_error: OnError) -> None:
    if context.code() is not None:  # already aborted: let grpc finish the call
        raise exc
    if isinstance(exc, grpc.RpcError):  # the client's stream broke off: its client or the server's stop ended it
        on_error(grpc.StatusCode.CANCELLED)
        context.abort(grpc.StatusCode.CANCELLED, "the call ended while its stream was being read")
    if isinstance(exc, QuailError):
        on_error(status_of(exc))
        context.abort(status_of(exc), str(exc))
    ref = uuid.uuid4().hex[:12]
    frames = "".join(traceback.format_tb(exc.__traceback__, limit=-LOGGED_FRAMES))
    log.error("internal error %s: %s: %s\n%s", ref, type(exc).__name__, exc, frames.rstrip())
    on_error(grpc.StatusCode.INTERNAL)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error (server log reference {ref})")


def _unary(fn: Callable, on_error: OnError) -> Callable:
    def call(request, context):
        try:
            return fn(request, context)
        except Exception as exc:  # noqa: BLE001 - every error leaves as a status
            _abort(context, exc, on_error)
    return call


def _streaming(fn: Callable, on_error: OnError) -> Callable:
    def call(request, context):
        try:
            yield from fn(request, context)
        except Exception as exc:  # noqa: BLE001 - every error leaves as a status
            _abort(context, exc, on_error)
    return call


def _ignore(status: grpc.StatusCode) -> None:
    """No one counts errors."""


def _parsed(fn: Callable, name: str) -> Callable:
    """A method taking the parsed request (the gRPC layer hands bytes: its own parse errors would leave as
    INTERNAL with a logged traceback, or stall a stream)."""
    return lambda request, context: fn(parse(name, request), context)


def _parsed_stream(fn: Callable, name: str) -> Callable:
    """A method taking the parsed messages of a client stream, parsed as they are read."""
    return lambda requests, context: fn((parse(name, data) for data in requests), context)


class FlightService:
    """The ten FlightService methods over a FlightHandler, logins checked.

    Adapts a FlightHandler to the ten FlightService methods; with an authenticator, every call but
    Handshake (the login) must carry a valid bearer token. `on_error` sees the status of each failed call."""

    def __init__(self, handler: FlightHandler, auth: Authenticator | None = None, on_error: OnError = _ignore) -> None:
        self.handler = handler
        self.auth = auth
        self.on_error = on_error

    def _authenticated(self, fn: Callable) -> Callable:
        if self.auth is None:
            return fn

        def call(request, context):
            self.auth.check(context)
            return fn(request, context)
        return call

    def generic_handler(self) -> grpc.GenericRpcHandler:
        counted = self.on_error

        def unary(fn: Callable, name: str) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(_unary(self._authenticated(_parsed(fn, name)), counted))

        def server_stream(fn: Callable, name: str) -> grpc.RpcMethodHandler:
            return grpc.unary_stream_rpc_method_handler(_streaming(self._authenticated(_parsed(fn, name)), counted))

        def bidi(fn: Callable, name: str, login: bool = False) -> grpc.RpcMethodHandler:
            method = _parsed_stream(fn, name)
            return grpc.stream_stream_rpc_method_handler(
                _streaming(method if login else self._authenticated(method), counted))

        return grpc.method_handlers_generic_handler(SERVICE, {
            "Handshake": bidi(self.handshake, "HandshakeRequest", login=True),
            "ListFlights": server_stream(self.list_flights, "Criteria"),
            "GetFlightInfo": unary(self.get_flight_info, "FlightDescriptor"),
            "PollFlightInfo": unary(self.unimplemented, "FlightDescriptor"),
            "GetSchema": unary(self.get_schema, "FlightDescriptor"),
            "DoGet": server_stream(self.do_get, "Ticket"),
            "DoPut": bidi(self.do_put, "FlightData"),
            "DoExchange": bidi(self.unimplemented, "FlightData"),
            "DoAction": server_stream(self.do_action, "Action"),
            "ListActions": server_stream(self.list_actions, "Empty"),
        })

    def handshake(self, requests: Iterator, context) -> Iterator[bytes]:
        """Echoes the requests; with an authenticator, Basic credentials here buy a bearer token."""
        if self.auth is not None:
            self.auth.login(context)
        for request in requests:
            yield FLIGHT["HandshakeResponse"](protocol_version=request.protocol_version).SerializeToString()

    def list_flights(self, criteria, context) -> Iterator[bytes]:
        return iter(())

    def get_flight_info(self, descriptor, context) -> bytes:
        return self.handler.get_flight_info(descriptor, context).SerializeToString()

    def get_schema(self, descriptor, context) -> bytes:
        schema = self.handler.get_schema(descriptor, context)
        return FLIGHT["SchemaResult"](schema=schema_bytes(schema)).SerializeToString()

    def do_get(self, ticket, context) -> Iterator[bytes]:
        schema, batches = self.handler.do_get(ticket, context)
        yield from encode(schema, batches)

    def do_put(self, messages: Iterator, context) -> Iterator[bytes]:
        first = next(messages, None)
        if first is None:
            raise InvalidArgument("the DoPut stream carried no message, not even its command (ADBC's driver sends "
                                  "none for an ingest of no rows): nothing was written; create an empty table with "
                                  "CREATE TABLE")
        if not first.HasField("flight_descriptor"):
            raise InvalidArgument("DoPut must start with a FlightData carrying a descriptor")
        # An update carries no data; some clients wait for its answer before they end their stream.
        reads = self.handler.reads_data(first.flight_descriptor, first_schema(first))
        stream = [first, *messages] if reads else [first]
        try:
            schema, batches, _ = decode(stream)
        except (ValueError, pa.ArrowException) as err:
            raise InvalidArgument(f"DoPut data is not a valid Arrow IPC stream: {err}") from None
        for metadata in self.handler.do_put(first.flight_descriptor, schema, batches, context):
            yield FLIGHT["PutResult"](app_metadata=metadata).SerializeToString()

    def do_action(self, action, context) -> Iterator[bytes]:
        for body in self.handler.do_action(action, context):
            yield FLIGHT["Result"](body=body).SerializeToString()

    def list_actions(self, empty, context) -> Iterator[bytes]:
        for kind, description in self.handler.list_actions():
            yield FLIGHT["ActionType"](type=kind, description=description).SerializeToString()

    def unimplemented(self, request, context):
        raise Unimplemented("not implemented by this server")
