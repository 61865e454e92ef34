"""The gRPC health service (grpc.health.v1.Health) beside Flight: what load balancers and Kubernetes probes ask.

`Check` answers at once; `Watch` streams the status now and each change after it.
The server is SERVING from the moment it listens (the model and tables are
loaded before that) until it starts to stop, then NOT_SERVING while running
calls drain. It answers for the whole server ("") and for the Flight service by
name; another name is NOT_FOUND to `Check` and SERVICE_UNKNOWN to `Watch`, as
the protocol says. No login is needed: a probe carries none, and the answer
says nothing about the data.
"""

from __future__ import annotations

import threading
from typing import Iterator

import grpc

from quail.server.protobuf import build_messages

SERVICE = "grpc.health.v1.Health"
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3  # HealthCheckResponse.ServingStatus (UNKNOWN is 0)
NAMES = ("", "arrow.flight.protocol.FlightService")
WATCH_POLL_S = 1.0  # how often a Watch stream notices that its client has gone

MESSAGES = build_messages("grpc.health.v1", {
    "HealthCheckRequest": [("service", 1, "string", "")],
    "HealthCheckResponse": [("status", 1, "int32", "")],  # the ServingStatus enum, as its varint
})


class Health:
    """The server's serving status, and the gRPC handler that reports it."""

    def __init__(self) -> None:
        self._status = SERVING
        self._changed = threading.Condition()

    def stopping(self) -> None:
        """From now on NOT_SERVING (the server drains its calls)."""
        with self._changed:
            self._status = NOT_SERVING
            self._changed.notify_all()

    def check(self, request, context: grpc.ServicerContext):
        if request.service not in NAMES:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no service named {request.service!r} here")
        return MESSAGES["HealthCheckResponse"](status=self._status)

    def watch(self, request, context: grpc.ServicerContext) -> Iterator:
        if request.service not in NAMES:
            yield MESSAGES["HealthCheckResponse"](status=SERVICE_UNKNOWN)
            return
        sent = None
        while context.is_active():
            with self._changed:
                if self._status == sent:
                    self._changed.wait(WATCH_POLL_S)
                status = self._status
            if status != sent:
                sent = status
                yield MESSAGES["HealthCheckResponse"](status=status)

    def generic_handler(self) -> grpc.GenericRpcHandler:
        request, response = MESSAGES["HealthCheckRequest"], MESSAGES["HealthCheckResponse"]
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Check": grpc.unary_unary_rpc_method_handler(self.check, request.FromString, response.SerializeToString),
            "Watch": grpc.unary_stream_rpc_method_handler(self.watch, request.FromString,
                                                          response.SerializeToString),
        })
