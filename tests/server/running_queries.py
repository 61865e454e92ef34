"""What the tests of running queries share: their tables and statements, and calls that start, watch and
cancel a query on a real server process (Flight's own calls beside ADBC's)."""

from __future__ import annotations

import threading
from typing import Callable

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from quail.server import health
from quail.server import sql_messages as sql
from quail.server.flight_messages import FLIGHT

REVIEWS = pa.table({"id": list(range(600)),
                    "body": [f"Review {i}: the soup was {'cold' if i % 2 else 'hot'} and the staff "
                             f"{'rude' if i % 3 else 'kind'}; we paid {i % 40 + 10} euros." for i in range(600)]})
TOPICS = pa.table({"id": list(range(12)), "topic": ["food", "service", "price", "noise", "a film", "weather",
                                                    "a car", "music", "sports", "travel", "books", "health"]})
LONG = ("SELECT r.id, t.id FROM reviews r JOIN topics t "
        "ON AI_FILTER(PROMPT('Is the review {0} about {1}?', r.body, t.topic))")  # 7,200 model requests
QUICK = "SELECT id FROM topics WHERE AI_FILTER(PROMPT('Is {0} about food?', topic)) ORDER BY id"
# Passes of 512 tokens (about a second on a CPU core; 1,024, the default, about two): a query sent
# while the long one runs joins it at the next pass, and a cancel or a time limit stops it there.
SHORT_PASSES = ("--token-budget", "512")


def flight_info(client: flight.FlightClient, query: str) -> flight.FlightInfo:
    """The statement's FlightInfo (GetFlightInfo: ADBC prepares and runs it from here)."""
    command = sql.pack(sql.new("CommandStatementQuery", query=query))
    return client.get_flight_info(flight.FlightDescriptor.for_command(command))


def reading(client: flight.FlightClient, info: flight.FlightInfo) -> tuple[threading.Thread, list]:
    """A thread redeeming the info's ticket, and the list its table or its FlightError lands in."""
    outcome: list = []

    def read() -> None:
        try:
            outcome.append(client.do_get(info.endpoints[0].ticket).read_all())
        except flight.FlightError as err:
            outcome.append(err)

    thread = threading.Thread(target=read)
    thread.start()
    return thread, outcome


def cancel_flight_info(client: flight.FlightClient, info: flight.FlightInfo) -> int:
    """The CancelFlightInfo action's answer for the info (a CANCEL_STATUS_* of flight_messages)."""
    parsed = FLIGHT["FlightInfo"]()
    parsed.ParseFromString(info.serialize())
    body = FLIGHT["CancelFlightInfoRequest"](info=parsed).SerializeToString()
    (result,) = client.do_action(flight.Action("CancelFlightInfo", body))
    status = FLIGHT["CancelFlightInfoResult"]()
    status.ParseFromString(result.body.to_pybytes())
    return status.status


def progress(cur, query: str) -> dict | None:
    """The query's quail_queries row (None: not running)."""
    cur.execute("SELECT * FROM quail_queries")
    return next((row for row in cur.fetch_arrow_table().to_pylist() if row["query"] == query), None)


def once_under_way(cur, query: str, column: str, above: int = 0) -> dict | None:
    """The query's quail_queries row once its `column` is above `above` (None: not within a minute)."""
    for _ in range(240):
        row = progress(cur, query)
        if row is not None and row[column] > above:
            return row
        threading.Event().wait(0.25)
    return None


def health_calls(uri: str) -> tuple[grpc.Channel, Callable, Callable]:
    """A channel to the server's health service, and its Check and Watch calls (service name in, statuses out)."""
    channel = grpc.insecure_channel(uri.removeprefix("grpc://"))
    request, response = health.MESSAGES["HealthCheckRequest"], health.MESSAGES["HealthCheckResponse"]
    check = channel.unary_unary(f"/{health.SERVICE}/Check", request.SerializeToString, response.FromString)
    watch = channel.unary_stream(f"/{health.SERVICE}/Watch", request.SerializeToString, response.FromString)
    return channel, lambda name: check(request(service=name), timeout=10).status, \
        lambda name: (reply.status for reply in watch(request(service=name), timeout=60))
