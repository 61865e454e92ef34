"""Prometheus metrics of one server, on an HTTP port: queries, model tokens, speed of light, errors by status.

Rates come from the counters (tokens per second: rate(quail_tokens_total[1m]);
the KV hit rate: rate of cached over rate of logical tokens). Each server owns its registry.
"""

from __future__ import annotations

from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from quail.engine.runner import ModelRunner


class Metrics:
    """The server's counters, gauges and histograms, in a registry of its own."""

    def __init__(self, runner: ModelRunner) -> None:
        self.registry = CollectorRegistry()
        self.running = Gauge("quail_queries_running", "Queries executing or waiting for the model",
                             registry=self.registry)
        Gauge("quail_queries_waiting", "Queries waiting for their turn on the device (for one forward pass)",
              registry=self.registry).set_function(runner.turns.waiting)
        Gauge("quail_kv_resident_bytes", "Bytes of KV kept between forward passes and still needed",
              registry=self.registry).set_function(lambda: runner.ledger.resident_bytes)
        Gauge("quail_kv_cached_bytes", "Bytes of documents' KV kept between AI steps and queries",
              registry=self.registry).set_function(lambda: runner.cache.resident_bytes if runner.cache else 0)
        self.queries = Counter("quail_queries", "Queries finished, by gRPC status", ["status"],
                               registry=self.registry)
        self.tokens = Counter("quail_tokens", "Model tokens of finished queries: logical (every prompt in "
                              "full), fresh (computed), cached (served from resident KV)", ["kind"],
                              registry=self.registry)
        self.requests = Counter("quail_model_requests", "Model requests of finished queries", registry=self.registry)
        self.seconds = Histogram("quail_query_seconds", "Wall seconds per query", registry=self.registry,
                                 buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800))
        self.sol = Histogram("quail_query_sol_fraction", "Speed-of-light seconds over wall seconds, per query",
                             registry=self.registry, buckets=(0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0))
        self.errors = Counter("quail_errors", "Calls that ended in an error, by gRPC status", ["status"],
                              registry=self.registry)

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics over HTTP; the port listened on."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port

    def query_done(self, report: dict[str, Any]) -> None:
        self.queries.labels("OK").inc()
        for kind in ("logical", "fresh", "cached"):
            self.tokens.labels(kind).inc(report[f"{kind}_tokens"])
        self.requests.inc(report["requests"])
        self.seconds.observe(report["wall_s"])
        if report["sol_s"] is not None and report["wall_s"] > 0:
            self.sol.observe(report["sol_s"] / report["wall_s"])

    def query_failed(self, status: grpc.StatusCode) -> None:
        self.queries.labels(status.name).inc()

    def error(self, status: grpc.StatusCode) -> None:
        self.errors.labels(status.name).inc()
