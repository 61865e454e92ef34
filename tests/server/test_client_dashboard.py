"""clients/dashboard.py serves its page over a real server: ranked reviews, topic bars, running queries, metrics."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from quail.clients import dashboard
from quail.clients.demo import REVIEWS
from quail.clients.server_process import ServerProcess, free_port


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with metrics, and `python -m quail.clients.dashboard --load-demo` over it: (server, page URL)."""
    metrics_port = free_port()
    with ServerProcess(tmp_path_factory.mktemp("data"), "--log-level", "warning",
                       "--metrics-port", str(metrics_port)) as server:
        process = subprocess.Popen([sys.executable, "-m", "quail.clients.dashboard", server.uri, "--port", "0",
                                    "--load-demo", "--metrics-url", f"http://127.0.0.1:{metrics_port}/metrics"],
                                   stdout=subprocess.PIPE, text=True)
        try:
            ready = process.stdout.readline()
            assert ready.startswith("dashboard: serving http://127.0.0.1:"), ready
            yield server, ready.split()[-1]
        finally:
            process.terminate()
            process.wait(30)


def test_the_page_shows_ranked_reviews_topic_bars_running_queries_and_metrics(served):
    _, url = served
    with urllib.request.urlopen(url, timeout=120) as response:
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        page = response.read().decode()
    assert f'<meta http-equiv="refresh" content="{dashboard.REFRESH_S}">' in page and "Traceback" not in page
    scores = [float(s) for s in re.findall(r'<td class="score">([\d.]+)<div class="bar">', page)]
    assert len(scores) == len(REVIEWS) and scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert all(html.escape(body) in page for _, body, _ in REVIEWS)
    topics = dict(re.findall(r'<td class="label">([^<]+)</td><td style="width:70%"><div class="bar"><span '
                             r'style="width:[\d.]+%"></span></div></td><td class="num">(\d+)</td>', page))
    assert set(topics) == set(dashboard.TOPICS) and sum(map(int, topics.values())) == len(REVIEWS)
    assert "Running queries (quail_queries)" in page and "No queries running." in page  # the page's own is left out
    assert re.search(r"<dt>queries finished</dt><dd>OK [\d,]+</dd>", page)
    assert re.search(r"<dt>KV pool used</dt><dd>[\d,]+ of [\d,]+ MiB<div class=\"bar\">", page)


def test_load_demo_leaves_an_existing_table_alone_and_other_paths_are_not_found(served):
    server, url = served
    assert dashboard.load_demo(server.uri) is False
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(url + "favicon.ico", timeout=10)


def test_running_queries_show_progress_and_are_escaped():
    rows = [{"query_id": "ab12", "user_name": "<ann>", "query": "SELECT '<script>' FROM t", "elapsed_s": 2.5,
             "tokens_done": 1024, "tokens_planned": 4096, "queue_place": 1},
            {"query_id": "cd34", "user_name": "bo", "query": dashboard.RUNNING, "elapsed_s": 0.0,
             "tokens_done": 0, "tokens_planned": 0, "queue_place": None}]
    shown = dashboard.running_html(rows)
    assert "&lt;script&gt;" in shown and "<script>" not in shown and "&lt;ann&gt;" in shown
    assert "1,024 / 4,096" in shown and 'style="width:25.0%"' in shown and "2.5s" in shown
    assert "cd34" not in shown, "the dashboard's own look at quail_queries is left out"


def test_errors_are_shown_as_text_not_a_traceback():
    closed = free_port()
    shown = dashboard.page(f"grpc://127.0.0.1:{closed}", f"http://127.0.0.1:{closed}/metrics")
    assert shown.count('<p class="error">') == 4 and "Traceback" not in shown
    assert "Unavailable" in shown and "Connection refused" in shown
    assert "missing protocol scheme" in dashboard.page("::::")
