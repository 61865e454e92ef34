"""Logins, bearer tokens on every call, expiry, TLS, and refusing an open public address: a real server."""

from __future__ import annotations

import time

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from quail.clients.server_process import ServerProcess, free_port
from quail.server import sql_messages as sql
from quail.server.config import ServerConfig
from tests.tls_certs import self_signed

TTL = 4.0


def _query(uri: str, **db_kwargs) -> list[dict]:
    with flight_sql.connect(uri, db_kwargs=db_kwargs or None, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT 41 + 1 AS x")
        return cur.fetch_arrow_table().to_pylist()


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("secured")
    users = root / "users"
    users.write_text("# who may log in\nann:s3cret\n")
    with ServerProcess(root / "data", "--users", str(users), "--token-ttl", str(TTL)) as server:
        yield server


def test_login_gives_access(secured):
    assert _query(secured.uri, username="ann", password="s3cret") == [{"x": 42}]


@pytest.mark.parametrize("credentials", [{"username": "ann", "password": "wrong"}, {"username": "bob", "password": "x"},
                                         {}], ids=["wrong-password", "unknown-user", "none"])
def test_bad_or_missing_credentials_are_unauthenticated(secured, credentials):
    with pytest.raises(adbc_driver_manager.Error, match="UNAUTHENTICATED"):
        _query(secured.uri, **credentials)


def test_health_probes_need_no_login_and_see_nothing_else(secured):
    """A load balancer's probe carries no credentials: the health service answers it, Flight does not."""
    import grpc

    from quail.server import health

    request, response = health.MESSAGES["HealthCheckRequest"], health.MESSAGES["HealthCheckResponse"]
    with grpc.insecure_channel(secured.uri.removeprefix("grpc://")) as channel:
        check = channel.unary_unary(f"/{health.SERVICE}/Check", request.SerializeToString, response.FromString)
        assert check(request(service=""), timeout=10).status == health.SERVING
    with pytest.raises(adbc_driver_manager.Error, match="UNAUTHENTICATED"):
        _query(secured.uri)


def test_every_call_needs_a_valid_unexpired_token(secured):
    client = flight.connect(secured.uri)
    command = flight.FlightDescriptor.for_command(sql.pack(sql.new("CommandStatementQuery", query="SELECT 1")))
    calls = [lambda o: list(client.list_actions(o)), lambda o: client.get_flight_info(command, o),
             lambda o: client.get_schema(command, o), lambda o: list(client.list_flights(options=o)),
             lambda o: client.do_get(flight.Ticket(b"x"), o).read_all()]
    forged = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer eyJ1c2VyIjoiYW5uIn0.AAAA")])
    for call in calls:
        for options in (flight.FlightCallOptions(), forged):
            # pyarrow raises FlightUnauthenticatedError, or for GetSchema an OSError naming the status
            with pytest.raises((flight.FlightUnauthenticatedError, OSError), match="(?i)unauthenticated"):
                call(options)
    header = client.authenticate_basic_token(b"ann", b"s3cret")
    fresh = flight.FlightCallOptions(headers=[header])
    assert client.get_flight_info(command, fresh).schema.names == ["1"]
    time.sleep(TTL + 1)
    with pytest.raises(flight.FlightUnauthenticatedError, match="expired"):
        client.get_flight_info(command, fresh)


def test_tls_round_trip(tmp_path):
    cert, key = self_signed(tmp_path)
    with ServerProcess(tmp_path / "data", "--tls-cert", str(cert), "--tls-key", str(key)) as server:
        assert server.uri.startswith("grpc+tls://")
        assert _query(server.uri, **{"adbc.flight.sql.client_option.tls_root_certs": cert.read_text()}) == [{"x": 42}]
        with pytest.raises(adbc_driver_manager.Error):
            _query(server.uri.replace("grpc+tls://", "grpc://"))


def test_public_address_needs_auth_or_an_explicit_yes(tmp_path):
    with pytest.raises(ValueError, match="refusing to serve 0.0.0.0 without authentication"):
        ServerConfig(host="0.0.0.0", data_dir=tmp_path).check()
    ServerConfig(host="0.0.0.0", data_dir=tmp_path, public_without_auth=True).check()
    ServerConfig(host="0.0.0.0", data_dir=tmp_path, users_file=tmp_path / "users").check()


@pytest.fixture(scope="module")
def roles(tmp_path_factory):
    """A server whose users file gives each role: reader (the default), writer, admin; metrics served."""
    root = tmp_path_factory.mktemp("roles")
    users = root / "users"
    users.write_text("reader:r-pass\nwriter:w:pass:write\nboss:b-pass:admin\n")
    port = free_port()
    with ServerProcess(root / "data", "--users", str(users), "--metrics-port", str(port)) as server:
        server.metrics_port = port
        yield server


def _connect(uri: str, user: str, password: str):
    return flight_sql.connect(uri, db_kwargs={"username": user, "password": password}, autocommit=True)


def test_only_writers_change_tables_and_everyone_reads_them(roles):
    with _connect(roles.uri, "writer", "w:pass") as conn, conn.cursor() as cur:
        cur.adbc_ingest("shared", pa.table({"x": [1, 2]}), mode="create")
        cur.execute("INSERT INTO shared VALUES (3)")
    with _connect(roles.uri, "reader", "r-pass") as conn, conn.cursor() as cur:
        cur.execute("SELECT sum(x) FROM shared")
        assert cur.fetchall() == [(6,)]
        for attempt in (lambda: cur.adbc_ingest("mine", pa.table({"x": [1]}), mode="create"),
                        lambda: cur.execute("DROP TABLE shared"),
                        lambda: cur.execute("INSERT INTO shared VALUES (4)"),
                        lambda: cur.execute("CREATE TABLE copy AS SELECT * FROM shared")):
            with pytest.raises(adbc_driver_manager.Error, match="PERMISSION_DENIED|UNAUTHORIZED") as err:
                attempt()
            assert "'reader' may not" in str(err.value) and "role is 'read'" in str(err.value)
        cur.execute("SELECT sum(x) FROM shared")
        assert cur.fetchall() == [(6,)], "nothing was written"


def test_query_text_shows_to_its_user_and_admins_only(roles):
    def running_queries(user: str, password: str) -> list[dict]:
        with _connect(roles.uri, user, password) as conn, conn.cursor() as cur:
            cur.execute("SELECT user_name, query FROM quail_queries")
            return cur.fetch_arrow_table().to_pylist()

    mine = running_queries("reader", "r-pass")
    assert mine == [{"user_name": "reader", "query": "SELECT user_name, query FROM quail_queries"}]
    from quail.engine.runtime.query_work import QueryWork
    from quail.server.statements import Running
    from quail.server.system_tables import HIDDEN, queries_table

    running = {b"a" * 16: Running(QueryWork(), "SELECT secret", "writer"),
               b"b" * 16: Running(QueryWork(), "SELECT mine", "reader")}
    assert queries_table(running, "reader", everyone=False)["query"].to_pylist() == [HIDDEN, "SELECT mine"]
    assert queries_table(running, "boss", everyone=True)["query"].to_pylist() == ["SELECT secret", "SELECT mine"]


def test_failed_logins_slow_that_user_from_that_address_and_lock_no_one_out(roles):
    for _ in range(5):
        with pytest.raises(adbc_driver_manager.Error, match="wrong username or password"):
            _connect(roles.uri, "boss", "guess").cursor().execute("SELECT 1")
    for name in (f"nobody{i}" for i in range(20)):  # usernames rotated from one address
        with pytest.raises(adbc_driver_manager.Error, match="wrong username or password"):
            _connect(roles.uri, name, "guess").cursor().execute("SELECT 1")
    with _connect(roles.uri, "reader", "r-pass") as conn, conn.cursor() as cur:  # another user, same address
        cur.execute("SELECT 1 AS x")
        assert cur.fetchall() == [(1,)]
    started = time.monotonic()
    with _connect(roles.uri, "boss", "b-pass") as conn, conn.cursor() as cur:  # slowed, not refused
        cur.execute("SELECT 1 AS x")
        assert cur.fetchall() == [(1,)]
    assert time.monotonic() - started >= 0.5  # it waited its turn (1 s after the fifth failure)


def test_a_slowed_pair_waits_its_turn_and_a_flood_is_refused():
    """The throttle's turns on a fake clock: after FREE_FAILURES the next try waits 1 s, the one after its
    failure 2 s; tries made together queue a second apart until a turn is more than MAX_WAIT_S away, then
    are refused; a success clears the pair; other pairs never wait."""
    from quail.engine.errors import Unauthenticated
    from quail.server.auth import FREE_FAILURES, MAX_WAIT_S, Throttle

    now, slept = [100.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    throttle = Throttle(clock=lambda: now[0], sleep=sleep)
    for _ in range(FREE_FAILURES):
        throttle.turn("boss", "10.0.0.1")
        throttle.failed("boss", "10.0.0.1")
    throttle.turn("boss", "10.0.0.2")  # the same user from elsewhere, another user from there: no wait
    throttle.turn("reader", "10.0.0.1")
    assert slept == []
    throttle.turn("boss", "10.0.0.1")
    throttle.failed("boss", "10.0.0.1")
    throttle.turn("boss", "10.0.0.1")
    assert slept == [1.0, 2.0]
    throttle.succeeded("boss", "10.0.0.1")
    throttle.turn("boss", "10.0.0.1")
    assert slept == [1.0, 2.0]

    together: list[float] = []  # tries that wait side by side: the clock does not move while they wait
    flood = Throttle(clock=lambda: 0.0, sleep=together.append)
    for _ in range(FREE_FAILURES):
        flood.failed("boss", "10.0.0.1")
    with pytest.raises(Unauthenticated, match="too many failed logins for 'boss' from this address"):
        for _ in range(100):
            flood.turn("boss", "10.0.0.1")
    assert together == [float(n) for n in range(1, int(MAX_WAIT_S) + 1)]


def test_a_ticket_is_its_users_alone(roles):
    """A user who learns another's ticket can neither redeem nor cancel it (NOT_FOUND, NOT_CANCELLABLE);
    its owner reads it afterwards."""
    from quail.server.flight_messages import CANCEL_STATUS_NOT_CANCELLABLE, FLIGHT

    client = flight.connect(roles.uri)
    reader = flight.FlightCallOptions(headers=[client.authenticate_basic_token(b"reader", b"r-pass")])
    writer = flight.FlightCallOptions(headers=[client.authenticate_basic_token(b"writer", b"w:pass")])
    command = flight.FlightDescriptor.for_command(sql.pack(sql.new("CommandStatementQuery", query="SELECT 42 AS x")))
    info = client.get_flight_info(command, reader)
    ticket = info.endpoints[0].ticket
    with pytest.raises(KeyError, match="not found error, with message: unknown or already redeemed ticket"):
        client.do_get(ticket, writer).read_all()
    request = FLIGHT["CancelFlightInfoRequest"](info=FLIGHT["FlightInfo"].FromString(info.serialize()))
    (result,) = client.do_action(flight.Action("CancelFlightInfo", request.SerializeToString()), writer)
    assert FLIGHT["CancelFlightInfoResult"].FromString(result.body.to_pybytes()).status == \
        CANCEL_STATUS_NOT_CANCELLABLE
    assert client.do_get(ticket, reader).read_all().to_pylist() == [{"x": 42}]


def test_metrics_need_an_admin_login(roles):
    import base64
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{roles.metrics_port}/metrics"
    for credentials in (None, "reader:r-pass", "boss:wrong"):
        request = urllib.request.Request(url)
        if credentials:
            request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 401 and "Basic" in err.value.headers["WWW-Authenticate"]
    admin = "Basic " + base64.b64encode(b"boss:b-pass").decode()
    request = urllib.request.Request(url, headers={"Authorization": admin})
    assert "quail_queries_running" in urllib.request.urlopen(request, timeout=10).read().decode()
