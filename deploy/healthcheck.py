"""Ask a Quail server's gRPC health service (grpc.health.v1) once: exit 0 when it answers SERVING, else 1."""

from __future__ import annotations

import argparse
import os
import sys

import grpc

from quail.server.health import MESSAGES, SERVICE, SERVING

CHECK = f"/{SERVICE}/Check"
STATUSES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}  # HealthCheckResponse.ServingStatus


def request(service: str) -> bytes:
    """A HealthCheckRequest for `service` ("" for the whole server), serialized."""
    return MESSAGES["HealthCheckRequest"](service=service).SerializeToString()


def status(response: bytes) -> int:
    """The status of a serialized HealthCheckResponse (0, UNKNOWN, when absent)."""
    return MESSAGES["HealthCheckResponse"].FromString(response).status


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
    return 0 if serving == SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
