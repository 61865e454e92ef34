"""Hostile calls: what an attacker or a careless client sends, each with the statuses a server may answer.

Each call is a function of a server's URI and a random source (and a login, where the server has users); it
reads a table `reviews` of `id` and `body` where it reads one, and returns the status the server answered
("OK", or the gRPC status name an ADBC or Flight error names). `HOSTILE` maps each call's name to it and to
the statuses allowed (anything else, a hang or a dead server is a finding):

- stop_list: AI_COMPLETE with 10,000 stop texts (refused: at most 16);
- huge_statement: a 2 MB statement (refused: --max-statement-bytes);
- huge_message: an ingest of one 80 MB batch (refused by gRPC: --max-message-bytes);
- many_terms: a 40,000-term condition (refused: DuckDB's optimizer would take minutes, or end the process);
- long_case: a CASE of 30,000 WHENs (refused: past the tokens the planner parses; in the duckdb dialect run by
  DuckDB, unparsed, in a second);
- odd_types: ingests of a decimal256(40, 2), a union and an unnamed column (refused by column), and a
  half float (stored as a float);
- deep_format: a response_format nested 3,000 deep (refused);
- sessions: 2,000 SetSessionOptions without a cookie (each opens a session; the server keeps a bounded number);
- login_storm: 30 wrong logins under rotating user names, where the server has users (UNAUTHENTICATED);
- foreign_ticket: a DoGet of a ticket that is not the caller's (NOT_FOUND).
"""

from __future__ import annotations

import decimal
import random
import re
from typing import Callable

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from quail.server import sql_messages as sql
from quail.server.flight_messages import FLIGHT

_STATUS = re.compile(r"\b(INVALID_ARGUMENT|RESOURCE_EXHAUSTED|UNAUTHENTICATED|NOT_FOUND|DEADLINE_EXCEEDED|TIMEOUT|"
                     r"CANCELLED|ALREADY_EXISTS|INTERNAL|UNKNOWN|UNAVAILABLE)\b")

Call = Callable[[str, random.Random], str]


def status(err: Exception) -> str:
    """The gRPC status an ADBC or Flight error names (ADBC calls RESOURCE_EXHAUSTED "INTERNAL", and names
    the gRPC code after: that one wins)."""
    text = str(err)
    if "(ResourceExhausted" in text or "larger than max" in text:
        return "RESOURCE_EXHAUSTED"
    if isinstance(err, flight.FlightUnauthenticatedError):
        return "UNAUTHENTICATED"
    if isinstance(err, KeyError):
        return "NOT_FOUND"
    match = _STATUS.search(text)
    return match.group(1) if match else "UNKNOWN"


def _run(uri: str, statement: str, credentials: dict[str, str] | None = None) -> str:
    try:
        with flight_sql.connect(uri, db_kwargs=credentials or {}, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(statement)
            cur.fetch_arrow_table()
        return "OK"
    except adbc_driver_manager.Error as err:
        return status(err)


def _ingest(uri: str, name: str, table: pa.Table, credentials: dict[str, str] | None = None) -> str:
    try:
        with flight_sql.connect(uri, db_kwargs=credentials or {}, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest(name, table, mode="replace")
        return "OK"
    except adbc_driver_manager.Error as err:
        return status(err)


def stop_list(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    stops = ", ".join(f"'s{i}'" for i in range(10_000))
    return _run(uri, f"SELECT AI_COMPLETE(PROMPT('Say {{0}}', body), {{'stop': [{stops}]}}) FROM reviews "
                     f"WHERE id = {rng.randrange(100)}", credentials)


def huge_statement(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    return _run(uri, "SELECT 1 AS x -- " + "y" * (2 << 20), credentials)


def huge_message(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    return _ingest(uri, "hostile_huge", pa.table({"x": pa.array(np.zeros(10_000_000, np.int64))}), credentials)


def many_terms(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    terms = " AND ".join(f"id <> {i}" for i in range(40_000))
    return _run(uri, f"SELECT count(*) FROM reviews WHERE {terms}", credentials)


def long_case(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    whens = " ".join(f"WHEN id = {i} THEN {i}" for i in range(30_000))
    return _run(uri, f"SELECT CASE {whens} END AS c FROM reviews WHERE id = {rng.randrange(100)}", credentials)


def odd_types(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    """The first odd column's status (each kind in turn; the half float is stored)."""
    columns = {"wide_decimal": pa.array([decimal.Decimal("1.5")], pa.decimal256(40, 2)),
               "union": pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([1])]),
               "half": pa.array(np.array([1.5], np.float16))}
    name = rng.choice([*columns, "unnamed"])
    table = pa.table({"": [1]}) if name == "unnamed" else pa.table({"a": columns[name]})
    return _ingest(uri, f"hostile_{name}", table, credentials)


def deep_format(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    nested = '{"a":' * 3000 + "1" + "}" * 3000
    return _run(uri, f"SELECT AI_COMPLETE(PROMPT('Say {{0}}', body), {{'response_format': '{nested}'}}) "
                     f"FROM reviews WHERE id = 1", credentials)


def sessions(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    client = flight.connect(uri)
    options = flight.FlightCallOptions(headers=[client.authenticate_basic_token(
        credentials["username"].encode(), credentials["password"].encode())] if credentials else [])
    entry = FLIGHT["SessionOptionEntry"](key="dialect", value=FLIGHT["SessionOptionValue"](string_value="duckdb"))
    body = FLIGHT["SetSessionOptionsRequest"](session_options=[entry]).SerializeToString()
    try:
        for _ in range(2_000):
            list(client.do_action(flight.Action("SetSessionOptions", body), options))
        return "OK"
    except flight.FlightError as err:
        return status(err)
    finally:
        client.close()


def login_storm(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    """Wrong passwords under 30 rotating user names: each UNAUTHENTICATED (the server slows only those names
    from this address)."""
    if credentials is None:
        return "UNAUTHENTICATED"  # a server without users has no logins to storm
    found = set()
    for i in range(30):
        found.add(_run(uri, "SELECT 1", {"username": f"nobody{rng.randrange(10**6)}_{i}", "password": "guess"}))
    return found.pop() if len(found) == 1 else "UNKNOWN"


def foreign_ticket(uri: str, rng: random.Random, credentials: dict[str, str] | None = None) -> str:
    client = flight.connect(uri)
    try:
        headers = [client.authenticate_basic_token(credentials["username"].encode(),
                                                   credentials["password"].encode())] if credentials else []
        ticket = flight.Ticket(sql.pack(sql.new("TicketStatementQuery", statement_handle=rng.randbytes(16))))
        client.do_get(ticket, flight.FlightCallOptions(headers=headers)).read_all()
        return "OK"
    except (flight.FlightError, KeyError, pa.ArrowException) as err:
        return status(err)
    finally:
        client.close()


HOSTILE: dict[str, tuple[Callable[..., str], frozenset[str]]] = {
    "stop_list": (stop_list, frozenset({"INVALID_ARGUMENT"})),
    "huge_statement": (huge_statement, frozenset({"RESOURCE_EXHAUSTED"})),
    "huge_message": (huge_message, frozenset({"RESOURCE_EXHAUSTED"})),
    "many_terms": (many_terms, frozenset({"RESOURCE_EXHAUSTED"})),
    "long_case": (long_case, frozenset({"RESOURCE_EXHAUSTED", "OK"})),
    "odd_types": (odd_types, frozenset({"OK", "INVALID_ARGUMENT"})),
    "deep_format": (deep_format, frozenset({"INVALID_ARGUMENT"})),
    "sessions": (sessions, frozenset({"OK"})),
    "login_storm": (login_storm, frozenset({"UNAUTHENTICATED"})),
    "foreign_ticket": (foreign_ticket, frozenset({"NOT_FOUND"})),
}
