"""Logins, bearer tokens on every call, expiry, TLS, and refusing an open public address: a real server."""

from __future__ import annotations

import datetime as dt
import ipaddress
import time

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow.flight as flight
import pytest

from quail.clients.server_process import ServerProcess
from quail.server import sql_messages as sql
from quail.server.app import ServerConfig

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


def _self_signed(directory) -> tuple:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_round_trip(tmp_path):
    cert, key = _self_signed(tmp_path)
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
