"""A plain-HTML dashboard over a Quail server: AI-SQL results, running queries, metrics; refreshed every few seconds."""

from __future__ import annotations

import argparse
import contextlib
import html
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager

from .demo import SCORE, reviews_table
from .server_process import metric_samples

REFRESH_S = 5
TOPICS = ["restaurant", "hotel", "phone", "film", "book", "concert", "museum", "tour"]
TOPIC_COUNTS = ("SELECT AI_CLASSIFY(body, [" + ", ".join(f"'{topic}'" for topic in TOPICS) +
                "]):labels[0]::string AS topic, count(*) AS n FROM reviews GROUP BY topic")
RUNNING = ("SELECT query_id, user_name, query, elapsed_s, tokens_done, tokens_planned, queue_place "
           "FROM quail_queries ORDER BY started")
MIB = 1024 * 1024

Rows = list[dict[str, Any]]

STYLE = """
body { margin: 0; font: 13px/1.35 system-ui, "DejaVu Sans", sans-serif; color: #1f2933; background: #f2f4f7; }
header { display: flex; align-items: baseline; gap: 16px; padding: 12px 24px; background: #1f2933; color: #fff; }
header h1 { margin: 0; font-size: 20px; } header span { color: #c1c9d2; font-size: 13px; }
main { display: grid; grid-template-columns: 7fr 4fr; grid-template-rows: auto 1fr; gap: 16px; padding: 16px 24px;
       align-items: start; }
section { background: #fff; border-radius: 8px; padding: 12px 16px; box-shadow: 0 1px 3px rgba(0,0,0,.12); }
section.reviews { grid-row: span 2; } section.queries { grid-column: 1 / -1; }
h2 { margin: 0 0 4px; font-size: 16px; }
code.sql { display: block; color: #616e7c; font-size: 11px; margin-bottom: 8px; }
table { border-collapse: collapse; width: 100%; }
th { text-align: left; color: #616e7c; font-weight: 600; white-space: nowrap; }
th, td { padding: 3px 6px; border-bottom: 1px solid #e4e7eb; vertical-align: middle; } td.num { text-align: right; }
.bar { background: #e4e7eb; border-radius: 3px; height: 10px; min-width: 60px; }
.bar span { display: block; height: 100%; border-radius: 3px; background: #3b82f6; }
.score { white-space: nowrap; } .score .bar { display: inline-block; width: 60px; margin-left: 8px; }
.score .bar span { background: #10b981; }
.stars { color: #f59e0b; white-space: nowrap; } .stars span { color: #d5dae0; }
.label { white-space: nowrap; } .error { color: #b91c1c; font-family: monospace; white-space: pre-wrap; }
.empty { color: #616e7c; } dl { display: grid; grid-template-columns: auto 1fr; gap: 4px 12px; margin: 0; }
dt { color: #616e7c; } dd { margin: 0; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _bar(fraction: float) -> str:
    return f'<div class="bar"><span style="width:{max(0.0, min(fraction, 1.0)) * 100:.1f}%"></span></div>'


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """An HTML table of cells already escaped."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _card(title: str, css: str, content: str, sql: str = "") -> str:
    caption = f'<code class="sql">{_e(sql)}</code>' if sql else ""
    return f'<section class="{css}"><h2>{_e(title)}</h2>{caption}{content}</section>'


def _error(err: Exception) -> str:
    return f'<p class="error">{_e(err)}</p>'


def reviews_html(rows: Rows) -> str:
    """The reviews as ranked: rank, P(yes) with a bar, the stars, the text."""
    return _table(["#", "AI_SCORE", "stars", "review"], [
        [f'<td class="num">{rank}</td>', f'<td class="score">{row["p_yes"]:.3f}{_bar(row["p_yes"])}</td>',
         f'<td class="stars">{"★" * row["stars"]}<span>{"★" * (5 - row["stars"])}</span></td>',
         f'<td>{_e(row["body"])}</td>'] for rank, row in enumerate(rows, 1)])


def topics_html(rows: Rows) -> str:
    """One bar per topic (every topic asked, the most common first): its share of the reviews."""
    counts = {topic: 0 for topic in TOPICS} | {str(row["topic"]): row["n"] for row in rows}
    total = sum(counts.values()) or 1
    return _table(["topic", "", "reviews"], [
        [f'<td class="label">{_e(topic)}</td>', f'<td style="width:70%">{_bar(n / total)}</td>',
         f'<td class="num">{n}</td>'] for topic, n in sorted(counts.items(), key=lambda item: -item[1])])


def running_html(rows: Rows) -> str:
    """The queries running now (but the dashboard's own look at them): progress in tokens, place in the queue."""
    rows = [row for row in rows if row["query"] != RUNNING]
    if not rows:
        return '<p class="empty">No queries running.</p>'
    return _table(["id", "user", "query", "elapsed", "tokens done / planned", "", "queue place"], [
        [f'<td>{_e(row["query_id"])}</td>', f'<td>{_e(row["user_name"])}</td>', f'<td>{_e(row["query"])}</td>',
         f'<td class="num">{row["elapsed_s"]:.1f}s</td>',
         f'<td class="num">{row["tokens_done"]:,} / {row["tokens_planned"]:,}</td>',
         f'<td style="width:15%">{_bar(row["tokens_done"] / max(row["tokens_planned"], 1))}</td>',
         f'<td class="num">{_e("–" if row["queue_place"] is None else row["queue_place"])}</td>'] for row in rows])


def metrics_html(samples: dict[str, float]) -> str:
    """Queries finished by status, running and waiting; tokens computed and cached; the KV pool in use."""
    statuses = [(m.group(1), value) for key, value in samples.items()
                if (m := re.fullmatch(r'quail_queries_total\{status="(.*)"\}', key))]
    finished = ", ".join(f"{status} {value:,.0f}" for status, value in sorted(statuses)) or "none yet"
    used, pool = samples.get("quail_kv_pool_used_bytes", 0.0), samples.get("quail_kv_pool_bytes", 0.0)
    fresh, cached = (samples.get(f'quail_tokens_total{{kind="{kind}"}}', 0.0) for kind in ("fresh", "cached"))
    items = [("queries finished", _e(finished)),
             ("running / waiting", f'{samples.get("quail_queries_running", 0):,.0f} / '
                                   f'{samples.get("quail_queries_waiting", 0):,.0f}'),
             ("tokens computed / cached", f"{fresh:,.0f} / {cached:,.0f}"),
             ("KV pool used", f"{used / MIB:,.0f} of {pool / MIB:,.0f} MiB{_bar(used / pool if pool else 0)}")]
    return "<dl>" + "".join(f"<dt>{_e(name)}</dt><dd>{value}</dd>" for name, value in items) + "</dl>"


def _rows(cur: Any, sql: str) -> Rows:
    cur.execute(sql)
    return cur.fetch_arrow_table().to_pylist()


def _sql_card(cur: Any, title: str, css: str, sql: str, render: Callable[[Rows], str]) -> str:
    """A card of a query's rows, or of the server's error."""
    try:
        return _card(title, css, render(_rows(cur, sql)), sql)
    except adbc_driver_manager.Error as err:
        return _card(title, css, _error(err), sql)


def _sql_cards(uri: str) -> list[str]:
    try:
        with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            return [_sql_card(cur, "Reviews ranked by AI_SCORE", "reviews", SCORE, reviews_html),
                    _sql_card(cur, "Topics by AI_CLASSIFY", "topics", TOPIC_COUNTS, topics_html),
                    _sql_card(cur, "Running queries (quail_queries)", "queries", RUNNING, running_html)]
    except adbc_driver_manager.Error as err:
        return [_card("Server", "reviews", _error(err))]


def _metrics_card(url: str) -> str:
    try:
        return _card("Server metrics", "metrics", metrics_html(metric_samples(url, timeout=5)))
    except (OSError, ValueError) as err:
        return _card("Server metrics", "metrics", _error(err))


def page(uri: str, metrics_url: str | None = None) -> str:
    """The whole dashboard, as HTML."""
    cards = _sql_cards(uri)
    if metrics_url:
        cards.insert(2, _metrics_card(metrics_url))
    return (f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_S}">'
            f"<title>Quail dashboard</title><style>{STYLE}</style></head><body><header><h1>Quail dashboard</h1>"
            f"<span>{_e(uri)} · {time.strftime('%H:%M:%S')} · refreshes every {REFRESH_S}s</span></header>"
            f"<main>{''.join(cards)}</main></body></html>")


def load_demo(uri: str) -> bool:
    """Ingest the demo's reviews as table `reviews` unless one exists; whether it did."""
    with flight_sql.connect(uri, autocommit=True) as conn:
        objects = conn.adbc_get_objects(depth="tables", table_name_filter="reviews").read_all().to_pylist()
        if any(table["table_name"] == "reviews" for catalog in objects for schema in catalog["catalog_db_schemas"]
               for table in schema["db_schema_tables"]):
            return False
        with conn.cursor() as cur:
            cur.adbc_ingest("reviews", reviews_table(), mode="create")
        return True


def make_server(uri: str, port: int, metrics_url: str | None = None) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:port (0: a free one) answering / with the dashboard."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?", 1)[0] != "/":
                self.send_error(404)
                return
            body = page(uri, metrics_url).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            """Requests are not logged."""

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m quail.clients.dashboard", description=__doc__)
    parser.add_argument("uri", nargs="?", default="grpc://127.0.0.1:8815", help="the Quail server")
    parser.add_argument("--port", type=int, default=8050, help="HTTP port of the page (default 8050; 0: a free one)")
    parser.add_argument("--load-demo", action="store_true",
                        help="create table reviews from the demo's reviews if the server has none")
    parser.add_argument("--metrics-url", default=None, help="the server's Prometheus page, http://HOST:PORT/metrics")
    args = parser.parse_args(argv)
    if args.load_demo:
        try:
            load_demo(args.uri)
        except adbc_driver_manager.Error as err:
            sys.exit(f"dashboard: could not load the demo's reviews: {err}")
    with make_server(args.uri, args.port, args.metrics_url) as server, contextlib.suppress(KeyboardInterrupt):
        print(f"dashboard: serving http://127.0.0.1:{server.server_port}/", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
