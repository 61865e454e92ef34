"""The server process: data directory, warm model, gRPC endpoint, clean stop on SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from quail.engine.errors import Unavailable
from quail.engine.exec.database import Database, objects
from quail.engine.runtime.loading import chosen, settled
from quail.engine.runtime.serving import serve_runtime

from quail.engine.exec.relational import quoted_name
from quail.server.auth import Access, Authenticator, load_users
from quail.server.config import ServerConfig
from quail.server.flight_sql import FlightSQLHandler
from quail.server.grpc_service import FlightService
from quail.server.health import Health
from quail.server.metrics import Metrics
from quail.server.query_service import QueryService

log = logging.getLogger("quail.server")
GRACE_S = 5.0  # after SIGTERM: running calls' time to finish before their queries are cancelled
EXIT_S = 10.0  # then: the cancelled work's time to stop before the process exits without it


def _options(config: ServerConfig) -> list[tuple[str, int]]:
    """gRPC's settings: a message a client sends is at most --max-message-bytes (gRPC refuses a longer one with
    RESOURCE_EXHAUSTED before the handler sees it), one the server sends is not bounded (the client bounds it);
    no SO_REUSEPORT: a port another server holds is refused, not shared (gRPC shares it by default)."""
    return [("grpc.max_receive_message_length", config.max_message_bytes), ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0)]


def _free(host: str, port: int) -> bool:
    """Whether a TCP port can be bound on the host (checked before gRPC binds it, so a busy port is one
    clear error rather than gRPC's log line)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return True  # not an address of this host: gRPC's bind says so
    try:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: a closed server's
            probe.bind(address)  # connections waiting out TIME-WAIT do not hold the port, a listening server does
        return True
    except OSError:
        return False


class QuailServer:
    """Loads the tables and the model, then serves Flight SQL until stopped."""

    def __init__(self, config: ServerConfig) -> None:
        config.check()
        self.config = config
        users = load_users(config.users_file) if config.users_file else None  # a bad file refused before the model loads
        self.database = Database(config.data_dir, config.memory_limit)  # refuses one another server holds
        engine = settled(config.engine)
        if engine.ray is not None and engine.replicas > 1:  # before any thread of ours (ray_replicas.connect)
            from quail.engine.runtime import ray_replicas  # Ray is an optional extra

            ray_replicas.connect(engine)
        self._executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="quail-call")
        self._grpc = grpc.server(self._executor, options=_options(config))
        self.port = self._listen(f"{config.host}:{config.port}")
        self.runtime = serve_runtime(engine)
        self.runtime.warm_up()
        self.database.serve_embeddings(self.runtime.embeddings)
        self.chosen = chosen(engine, self.runtime)  # what it runs on, for the startup line
        self.metrics = Metrics(self.runtime)
        self.auth = Authenticator(users, config.token_ttl_s) if users is not None else None
        self.handler = FlightSQLHandler(self.database, QueryService.serving(self.runtime, engine), config.dialect,
                                        config.limits, self.metrics, Access(users), config.transaction_idle_s)
        self._warm_stored()
        service = FlightService(self.handler, self.auth, self.metrics.error)
        self.health = Health()  # grpc.health.v1 on the same port, for load balancers and probes
        self._grpc.add_generic_rpc_handlers((service.generic_handler(), self.health.generic_handler()))

    def _warm_stored(self) -> None:
        """Have the text columns of the tables kept from before tokenized meanwhile (Warming.table)."""
        with self.database.cursor() as con:
            for schema, name, kind in objects(con):
                if kind == "TABLE":
                    self.handler.warming.table(con, f"{quoted_name(schema)}.{quoted_name(name)}")

    def _listen(self, address: str) -> int:
        """Bind the address (before the model loads, so a busy port fails at once); the port bound."""
        config = self.config
        if config.port and not _free(config.host, config.port):
            raise Unavailable(f"cannot listen on {address}: the port is in use")
        try:
            if config.tls_cert is not None:
                credentials = grpc.ssl_server_credentials([(config.tls_key.read_bytes(), config.tls_cert.read_bytes())])
                port = self._grpc.add_secure_port(address, credentials)
            else:
                port = self._grpc.add_insecure_port(address)
        except RuntimeError:
            port = 0
        if not port:
            raise Unavailable(f"cannot listen on {address} (in use, or not an address of this host)")
        return port

    @property
    def location(self) -> str:
        scheme = "grpc+tls" if self.config.tls_cert is not None else "grpc"
        return f"{scheme}://{self.config.host}:{self.port}"

    def start(self) -> None:
        self._grpc.start()
        if self.config.metrics_port is not None:
            port = self.metrics.serve(self.config.host, self.config.metrics_port,
                                      self.auth.admin_http if self.auth is not None else None)
            log.info("metrics on http://%s:%d/metrics", self.config.host, port)

    def stop(self, grace: float = GRACE_S) -> None:
        """Stop accepting calls; running calls get `grace` seconds to finish, then their calls end and their
        queries are cancelled (each stops within one forward pass of bounded size, or one DuckDB interrupt).
        The health service says NOT_SERVING from the start."""
        self.health.stopping()
        stopped = self._grpc.stop(grace)
        if not stopped.wait(grace + 0.5):
            self.handler.cancel_all()
        stopped.wait()

    def wait(self) -> None:
        self._grpc.wait_for_termination()

    def close(self, timeout: float = EXIT_S) -> bool:
        """After `wait`: give the cancelled statements and the calls' threads `timeout` seconds to end, then
        release the data directory; False when some thread was still running then."""
        self.handler.cancel_all()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self.runtime.replicas is not None:
            self.runtime.replicas.stop()
        deadline = time.monotonic() + timeout
        self.handler.wait_ended(deadline)  # the cancelled statements let go of the database before it closes
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join(max(0.0, deadline - time.monotonic()))
        self.handler.close()
        self.database.close()
        return not any(t.is_alive() and not t.daemon and t is not threading.current_thread()
                       for t in threading.enumerate())


def serve(config: ServerConfig) -> None:
    """Run a server in the foreground until SIGTERM or SIGINT; prints one ready line to stdout."""
    server = QuailServer(config)
    stopping = threading.Event()

    def on_signal(signum, frame) -> None:
        if not stopping.is_set():
            stopping.set()
            log.info("signal %d: stopping", signum)
            threading.Thread(target=server.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    with server.database.cursor() as con:
        log.info("model %s; database %s, %d tables and views", server.chosen, server.database.path.resolve(),
                 len(objects(con)))
    if config.engine.decisions != "model":
        log.warning("yes/no questions are answered by %s, not by the model (--decisions: for benchmarks)",
                    config.engine.decisions)
    print(f"quail: serving {server.location}", flush=True)
    server.wait()
    if not server.close():
        log.error("work still running %.0fs after its queries were cancelled: exiting without it", EXIT_S)
        logging.shutdown()
        os._exit(0)  # the database is consistent: every commit is in its write-ahead log
    log.info("stopped")
