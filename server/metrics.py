"""Prometheus metrics of one server on an HTTP port: queries, model tokens, speed of light, errors.

On a server with users, for admins only (HTTP Basic).

Rates come from the counters (tokens per second: rate(quail_tokens_total[1m]);
the KV hit rate: rate of quail_kv_hit_tokens_total over rate of quail_kv_looked_up_tokens_total). Each
server owns its registry.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from quail.engine.kv.resident import ResidentTree
from quail.engine.runtime.device_time import DeviceTime
from quail.engine.runtime.embeddings import Embeddings
from quail.engine.runtime.replicas import Replicas
from quail.engine.runtime.runtime import Runtime


class _TreeCounts:
    """The resident tree's counters as Prometheus counters (the hit rate: rate of hit over rate of looked up)."""

    def __init__(self, tree: ResidentTree) -> None:
        self.tree = tree

    def collect(self) -> Iterator[CounterMetricFamily]:
        counts = self.tree.counts
        yield CounterMetricFamily("quail_kv_looked_up_tokens", "Prompt tokens looked up in the resident tree",
                                  value=counts.looked_up)
        yield CounterMetricFamily("quail_kv_hit_tokens", "Prompt tokens found resident (not computed again)",
                                  value=counts.hit)
        yield CounterMetricFamily("quail_kv_inserted_tokens", "Tokens the resident tree began to index",
                                  value=counts.inserted)
        yield CounterMetricFamily("quail_kv_evicted_tokens", "Tokens the resident tree let go of for room",
                                  value=counts.evicted)
        yield CounterMetricFamily("quail_kv_host_offloaded_tokens", "Tokens moved from the KV pool to host memory",
                                  value=counts.offloaded)
        yield CounterMetricFamily("quail_kv_host_restored_tokens", "Tokens copied back from host memory to the "
                                  "KV pool (instead of computed again)", value=counts.restored)
        yield CounterMetricFamily("quail_kv_disk_moved_tokens", "Tokens moved from host memory to the disk tier",
                                  value=counts.to_disk)
        yield CounterMetricFamily("quail_kv_disk_restored_tokens", "Tokens copied back from the disk tier to the "
                                  "KV pool (instead of computed again)", value=counts.from_disk)


class _EmbeddingCounts:
    """The embedding model's texts as Prometheus counters: computed, kept from before, NULL."""

    def __init__(self, embeddings: Embeddings) -> None:
        self.embeddings = embeddings

    def collect(self) -> Iterator[CounterMetricFamily]:
        counts = self.embeddings.counts()
        family = CounterMetricFamily("quail_embedded_texts", "Texts AI_EMBED and AI_SIMILARITY asked the embedding "
                                     "model for: computed, cached (kept from an earlier statement), skipped (NULL)",
                                     labels=["kind"])
        for kind, value in (("computed", counts.computed), ("cached", counts.cached), ("skipped", counts.skipped)):
            family.add_metric([kind], value)
        yield family


class _DeviceBusy:
    """The device's busy seconds as a Prometheus counter (its rate: the device's utilization)."""

    def __init__(self, busy: DeviceTime) -> None:
        self.busy = busy

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("quail_device_busy_seconds", "Seconds the device ran forward passes (the "
                                  "server's own runtime; the rate is its utilization)", value=self.busy.seconds())


class _ReplicaCounts:
    """The replicas: how many, how many up, restarts, each one's queued and computed tokens and its device's
    busy seconds (replica 0's: `busy`, this process's own)."""

    def __init__(self, replicas: Replicas, busy: DeviceTime) -> None:
        self.replicas, self.busy = replicas, busy

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        replicas = self.replicas
        yield GaugeMetricFamily("quail_replicas", "Runtime replicas configured", value=replicas.count)
        yield GaugeMetricFamily("quail_replicas_up", "Runtime replicas serving", value=len(replicas.live()))
        yield CounterMetricFamily("quail_replica_restarts", "Replica processes started again after they ended",
                                  value=sum(replica.restarts for replica in replicas.remote))
        yield CounterMetricFamily("quail_replica_rerun_requests", "Model requests run again on another replica "
                                  "after theirs ended before answering", value=replicas.rerun)
        queued = GaugeMetricFamily("quail_replica_queued_tokens", "Prompt tokens routed to a replica and not yet "
                                   "answered", labels=["replica"])
        tokens = CounterMetricFamily("quail_replica_tokens", "Prompt tokens a replica answered: logical (every "
                                     "prompt in full), fresh (computed), cached (served from its resident KV)",
                                     labels=["replica", "kind"])
        for replica in range(replicas.count):
            queued.add_metric([str(replica)], replicas.router.queued[replica])
            stats = replicas.stats(replica)
            for kind, value in (("logical", stats.logical_tokens), ("fresh", stats.fresh_tokens),
                                ("cached", stats.cached_tokens)):
                tokens.add_metric([str(replica), kind], value)
        busy = CounterMetricFamily("quail_replica_device_busy_seconds", "Seconds a replica's device ran forward "
                                   "passes (absent for a replica that is down or slow to answer)", labels=["replica"])
        for replica, seconds in enumerate(replicas.busy_seconds(self.busy.seconds())):
            if seconds is not None:
                busy.add_metric([str(replica)], seconds)
        yield queued
        yield tokens
        yield busy


class Metrics:
    """The server's counters, gauges and histograms, in a registry of its own."""

    def __init__(self, runtime: Runtime) -> None:
        runner, scheduler, replicas, texts = runtime.runner, runtime.scheduler, runtime.replicas, runtime.texts
        self.registry = CollectorRegistry()
        self.running = Gauge("quail_queries_running", "Queries executing or waiting for the model",
                             registry=self.registry)
        Gauge("quail_queries_waiting", "Queries with model work in the device's scheduler",
              registry=self.registry).set_function(scheduler.waiting)
        pool, tree = runner.pool, runner.tree
        Gauge("quail_kv_pool_bytes", "Bytes of the device's KV pool", registry=self.registry).set_function(
            lambda: pool.capacity_bytes)
        Gauge("quail_kv_pool_used_bytes", "Bytes of the KV pool that some run holds (the tree or a running query)",
              registry=self.registry).set_function(lambda: pool.used * pool.bytes_per_token)
        Gauge("quail_kv_resident_bytes", "Bytes of KV that running queries hold for their next passes",
              registry=self.registry).set_function(lambda: runner.ledger.resident_bytes)
        Gauge("quail_kv_cached_bytes", "Bytes of KV the resident tree indexes for later steps and queries",
              registry=self.registry).set_function(lambda: tree.cached_bytes if tree else 0)
        host = tree.host if tree is not None else None
        Gauge("quail_kv_host_bytes", "Bytes of pinned host memory for KV the pool has no room for",
              registry=self.registry).set_function(lambda: host.capacity_bytes if host else 0)
        Gauge("quail_kv_host_used_bytes", "Bytes of KV the host tier holds", registry=self.registry
              ).set_function(lambda: tree.host_tokens * host.bytes_per_token if host else 0)
        disk = tree.disk if tree is not None else None
        Gauge("quail_kv_disk_bytes", "Bytes of the disk tier's file for KV the host tier has no room for",
              registry=self.registry).set_function(lambda: disk.capacity_bytes if disk else 0)
        Gauge("quail_kv_disk_used_bytes", "Bytes of KV the disk tier holds", registry=self.registry
              ).set_function(lambda: tree.disk_tokens * disk.bytes_per_token if disk else 0)
        if texts is not None:
            Gauge("quail_texts_tokens", "Token ids of the texts kept tokenized: documents (as their tables are "
                  "written, and as queries ask) and prompt parts", registry=self.registry).set_function(
                lambda: texts.tokens)
        self.warming = Gauge("quail_texts_warming", "Texts of tables just written that the warming thread has "
                             "not tokenized yet (0: every table's texts are as tokenized as they will be)",
                             registry=self.registry)
        self.registry.register(_DeviceBusy(scheduler.busy))
        self.registry.register(_EmbeddingCounts(runtime.embeddings))
        if tree is not None:
            self.registry.register(_TreeCounts(tree))
        if replicas is not None:
            self.registry.register(_ReplicaCounts(replicas, scheduler.busy))
        self.queries = Counter("quail_queries", "Queries finished, by gRPC status", ["status"],
                               registry=self.registry)
        self.tokens = Counter("quail_tokens", "Model tokens of finished queries: logical (every prompt in "
                              "full), fresh (computed), cached (served from resident KV), generated (chosen by "
                              "decoding)", ["kind"], registry=self.registry)
        self.decode_steps = Counter("quail_decode_steps", "Decode steps of finished queries (a step: the passes "
                                    "in which each of a generating step's running sequences gains a token)",
                                    registry=self.registry)
        self.requests = Counter("quail_model_requests", "Model requests of finished queries", registry=self.registry)
        self.seconds = Histogram("quail_query_seconds", "Wall seconds per query", registry=self.registry,
                                 buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800))
        self.sol = Histogram("quail_query_sol_fraction", "Speed-of-light seconds over wall seconds, per query",
                             registry=self.registry, buckets=(0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0))
        self.cascade_rows = Counter("quail_cascade_rows", "Rows of finished cascades (AI_FILTER with recall or "
                                    "precision targets, AI_CLASSIFY with an accuracy target), by what decided them: "
                                    "sample (the model, sampled), model (asked where the proxy could not decide), "
                                    "proxy (accepted or rejected by it)", ["decided_by"],
                                    registry=self.registry)
        self.errors = Counter("quail_errors", "Calls that ended in an error, by gRPC status", ["status"],
                              registry=self.registry)

    def serve(self, host: str, port: int, admits: Callable[[str | None, str], bool] | None = None) -> int:
        """Serve /metrics over HTTP; the port listened on. `admits(authorization header, client address)`:
        which requests may read it (None: all; else the others get 401 and a Basic challenge)."""
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                if admits is not None and not admits(self.headers.get("Authorization"), self.client_address[0]):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="quail metrics"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                """Requests are not logged."""

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="quail-metrics", daemon=True).start()
        return server.server_port

    def query_done(self, report: dict[str, Any]) -> None:
        self.queries.labels("OK").inc()
        for kind in ("logical", "fresh", "cached", "generated"):
            self.tokens.labels(kind).inc(report[f"{kind}_tokens"])
        self.requests.inc(report["requests"])
        self.decode_steps.inc(report["decode_steps"])
        self.seconds.observe(report["wall_s"])
        if report["sol_s"] is not None and report["wall_s"] > 0:
            self.sol.observe(report["sol_s"] / report["wall_s"])
        for stage in report["stages"]:
            if stage["operator"] == "ai_cascade":
                self.cascade_rows.labels("sample").inc(stage["sample_rows"])
                self.cascade_rows.labels("model").inc(stage["asked"])
                self.cascade_rows.labels("proxy").inc(stage["accepted"] + stage.get("rejected", 0))

    def query_failed(self, status: grpc.StatusCode) -> None:
        self.queries.labels(status.name).inc()

    def error(self, status: grpc.StatusCode) -> None:
        self.errors.labels(status.name).inc()
