"""Ask a Quail server's gRPC health service (grpc.health.v1) once: exit 0 when it answers SERVING, else 1."""

from __future__ import annotations

import argparse
import os
import sys

import grpc

CHECK = "/grpc.health.v1.Health/Check"
STATUSES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}  # HealthCheckResponse.ServingStatus


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at `at` and the offset after it."""
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def request(service: str) -> bytes:
    """A HealthCheckRequest: field 1 (service) as a string; the whole server ("") is the empty message."""
    name = service.encode()
    return b"\x0a" + _varint(len(name)) + name if name else b""


def status(response: bytes) -> int:
    """The status (field 1, a varint) of a HealthCheckResponse; 0 (UNKNOWN) when absent, as proto3 omits it."""
    at, found = 0, 0
    while at < len(response):
        tag, at = _read_varint(response, at)
        kind = tag & 7
        if kind == 0:
            value, at = _read_varint(response, at)
            found = value if tag >> 3 == 1 else found
        elif kind == 2:
            size, at = _read_varint(response, at)
            at += size
        else:
            at += 8 if kind == 1 else 4
    return found


def _channel(address: str, tls_ca: str | None, server_name: str | None) -> grpc.Channel:
    if tls_ca is None:
        return grpc.insecure_channel(address)
    with open(tls_ca, "rb") as pem:
        credentials = grpc.ssl_channel_credentials(root_certificates=pem.read())
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(address, credentials, options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address", nargs="?", default=os.environ.get("QUAIL_HEALTH_ADDRESS", "127.0.0.1:8815"),
                        help="HOST:PORT of the Flight port (default $QUAIL_HEALTH_ADDRESS or 127.0.0.1:8815)")
    parser.add_argument("--service", default="", help="service name to ask about (default: the whole server)")
    parser.add_argument("--tls-ca", default=os.environ.get("QUAIL_HEALTH_TLS_CA"),
                        help="PEM of the CA that signed the server's certificate: connect with TLS "
                             "(default $QUAIL_HEALTH_TLS_CA; unset: plaintext)")
    parser.add_argument("--server-name", default=os.environ.get("QUAIL_HEALTH_SERVER_NAME"),
                        help="the name the certificate must carry, when it is not the address's host "
                             "(default $QUAIL_HEALTH_SERVER_NAME)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)")
    args = parser.parse_args(argv)
    try:
        with _channel(args.address, args.tls_ca, args.server_name) as channel:
            answer = channel.unary_unary(CHECK)(request(args.service), timeout=args.timeout)
    except (grpc.RpcError, OSError) as err:
        print(f"unhealthy: {err.code().name if isinstance(err, grpc.RpcError) else err}")
        return 1
    serving = status(answer)
    print(STATUSES.get(serving, str(serving)))
    return 0 if serving == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
