"""The server's settings, and the checks they pass before anything heavy loads (a bad option fails at once)."""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from quail.engine.model.config import EngineConfig
from quail.planner.dialects import DEFAULT_DIALECT, DIALECTS
from quail.server.admission import Limits

MIN_TOKEN_BUDGET = 16
TRANSACTION_IDLE_S = 300.0  # an open transaction unused this long is rolled back (its client is gone)
MAX_MESSAGE_BYTES = 64 << 20  # the largest gRPC message a client may send, by default
MIN_MESSAGE_BYTES = 64 << 10  # below this, catalog replies and ordinary statements would not fit


@dataclass(frozen=True)
class ServerConfig:
    """Where to listen, where the data lives, which model to serve."""

    host: str = "127.0.0.1"
    port: int = 8815
    data_dir: Path = Path("data")
    engine: EngineConfig = field(default_factory=EngineConfig)  # the model, device, precision, token budget
    dialect: str = DEFAULT_DIALECT
    workers: int = 16
    users_file: Path | None = None  # user:password lines; None: no authentication
    token_ttl_s: float = 3600.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    public_without_auth: bool = False  # listen on a non-loopback address with no authentication
    limits: Limits = Limits()
    metrics_port: int | None = None  # Prometheus /metrics over HTTP on the same host; None: not served
    memory_limit: str | None = None  # DuckDB's memory limit ("4GB"); None: DuckDB's default (80% of RAM)
    transaction_idle_s: float = TRANSACTION_IDLE_S
    max_message_bytes: int = MAX_MESSAGE_BYTES  # the largest gRPC message a call may send (an ingest: each batch)

    def check(self) -> None:
        """Refuse settings that would expose data: no auth off loopback unless told; TLS needs both files."""
        for name, port in (("port", self.port), ("metrics port", self.metrics_port)):
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"{name} {port} is not a TCP port (0 to 65535)")
        if self.engine.token_budget is not None and self.engine.token_budget < MIN_TOKEN_BUDGET:
            raise ValueError(f"the token budget must be at least {MIN_TOKEN_BUDGET} tokens a forward pass")
        if self.engine.kv_cache_bytes is not None and self.engine.kv_cache_bytes < 0:
            raise ValueError("the KV cache's bytes cannot be negative (0: no cache)")
        if self.engine.replicas is not None and self.engine.replicas < 1:
            raise ValueError("there must be at least one replica")
        if self.engine.ray is not None and importlib.util.find_spec("ray") is None:
            raise ValueError("replicas on Ray need Ray installed: pip install 'quail-server[ray]'")
        if self.engine.kv_host_bytes is not None and self.engine.kv_host_bytes < 0:
            raise ValueError("the host KV tier's bytes cannot be negative (0: none)")
        if self.engine.kv_disk_bytes is not None and self.engine.kv_disk_bytes <= 0:
            raise ValueError("the disk KV tier's bytes must be positive")
        if self.engine.kv_disk_dir is not None and not Path(self.engine.kv_disk_dir).is_dir():
            raise ValueError(f"--kv-disk-dir {self.engine.kv_disk_dir} is not a directory")
        self.limits.check()
        if self.transaction_idle_s <= 0:
            raise ValueError("--transaction-idle must be a positive number of seconds")
        if self.max_message_bytes < MIN_MESSAGE_BYTES:
            raise ValueError(f"--max-message-bytes must be at least {MIN_MESSAGE_BYTES:,}")
        if self.memory_limit is not None and not re.fullmatch(r"\s*\d+(\.\d+)?\s*[KMGT]i?B\s*", self.memory_limit,
                                                              re.IGNORECASE):
            raise ValueError(f"--memory-limit {self.memory_limit!r} is not an amount of memory (e.g. 4GB, 512MiB)")
        if self.dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {self.dialect!r}; use one of {', '.join(DIALECTS)}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key file")
        if self.users_file is None and not _loopback(self.host) and not self.public_without_auth:
            raise ValueError(f"refusing to serve {self.host} without authentication: give a users file, "
                             "or say explicitly that the address may be served without it")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
