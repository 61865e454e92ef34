"""Transport floors: Flight SQL servers that do no work, to show what the RPCs alone cost a round trip.

    python -m bench.flight_floor grpcio|pyarrow     # serves on a free port; prints the port, then waits

Each answers every statement with the same one-row table (`SELECT 1`'s) and every SqlInfo request
with Quail's own SqlInfo rows, so the ADBC Flight SQL driver connects, prepares and runs as it does
against a real server: GetFlightInfo, then DoGet, per statement. What differs is the transport:
- `grpcio`: gRPC's Python server (a thread pool; messages built with Quail's own Flight protobufs and
  IPC encoding), the transport `quail serve` runs on;
- `pyarrow`: Arrow's C++ Flight server through pyarrow.flight (gRPC in C++, Python only in the handlers).
bench/plain_sql.py measures both beside DuckDB, Quail and roapi: a server on a transport costs a
round trip at least its floor.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from quail.server.flight_messages import FLIGHT, SERVICE, parse
from quail.server.ipc import encode, schema_bytes
from quail.server.metadata import sql_info
from quail.server.sql_messages import new, pack

ANSWER = pa.table({"1": pa.array([1], pa.int32())})
INFO, ROWS = b"info", b"rows"  # the two tickets: SqlInfo rows, or the answer
TRANSPORTS = ("grpcio", "pyarrow")


def ticket_for(command: bytes) -> bytes:
    """The ticket a descriptor's command gets: SqlInfo's rows for a CommandGetSqlInfo, else the answer."""
    return INFO if b"CommandGetSqlInfo" in command else ROWS


def table_for(ticket: bytes) -> pa.Table:
    """The rows behind a ticket."""
    return sql_info(()) if ticket == INFO else ANSWER


def prepared() -> bytes:
    """The body of CreatePreparedStatement's one result: a handle and the answer's schema."""
    return pack(new("ActionCreatePreparedStatementResult", prepared_statement_handle=b"h",
                    dataset_schema=schema_bytes(ANSWER.schema)))


def grpcio_server() -> tuple[Callable[[], None], int]:
    """The floor on grpcio: (wait, port)."""
    def get_flight_info(request: bytes, context) -> bytes:
        descriptor = parse("FlightDescriptor", request)
        ticket = ticket_for(descriptor.cmd)
        endpoint = FLIGHT["FlightEndpoint"](ticket=FLIGHT["Ticket"](ticket=ticket))
        return FLIGHT["FlightInfo"](schema=schema_bytes(table_for(ticket).schema), flight_descriptor=descriptor,
                                    endpoint=[endpoint], total_records=-1, total_bytes=-1).SerializeToString()

    def do_get(request: bytes, context) -> Iterator[bytes]:
        table = table_for(parse("Ticket", request).ticket)
        yield from encode(table.schema, table.to_batches())

    def do_action(request: bytes, context) -> Iterator[bytes]:
        if parse("Action", request).type == "CreatePreparedStatement":
            yield FLIGHT["Result"](body=prepared()).SerializeToString()

    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
        "GetFlightInfo": grpc.unary_unary_rpc_method_handler(get_flight_info),
        "DoGet": grpc.unary_stream_rpc_method_handler(do_get),
        "DoAction": grpc.unary_stream_rpc_method_handler(do_action)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server.wait_for_termination, port


class PyArrowFloor(flight.FlightServerBase):
    """The floor on Arrow's C++ Flight server."""

    def get_flight_info(self, context, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        ticket = ticket_for(descriptor.command)
        return flight.FlightInfo(table_for(ticket).schema, descriptor, [flight.FlightEndpoint(ticket, [])], -1, -1)

    def do_get(self, context, ticket: flight.Ticket) -> flight.RecordBatchStream:
        return flight.RecordBatchStream(table_for(ticket.ticket))

    def do_action(self, context, action: flight.Action) -> list[flight.Result]:
        return [flight.Result(prepared())] if action.type == "CreatePreparedStatement" else []


def pyarrow_server() -> tuple[Callable[[], None], int]:
    """The floor on pyarrow.flight: (wait, port)."""
    server = PyArrowFloor("grpc://127.0.0.1:0")
    threading.Thread(target=server.serve, daemon=True).start()
    return threading.Event().wait, server.port


def main(argv: list[str] | None = None) -> None:
    """Serve the named floor on a free port, print the port, and serve until killed."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in TRANSPORTS:
        sys.exit(f"usage: python -m bench.flight_floor {'|'.join(TRANSPORTS)}")
    wait, port = {"grpcio": grpcio_server, "pyarrow": pyarrow_server}[argv[0]]()
    print(port, flush=True)
    wait()


if __name__ == "__main__":
    main()
