"""`make demo` (python -m quail.clients.demo) runs end to end: a ranking, EXPLAIN ANALYZE, a watched and cancelled
query, fields extracted and complaints summarized per product."""

from __future__ import annotations

import re
import subprocess
import sys


def test_the_demo_shows_a_ranking_a_plan_run_and_a_cancelled_query():
    out = subprocess.run([sys.executable, "-m", "quail.clients.demo"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "(12 rows)" in text and re.search(r"rank correlation of p_yes with the stars: [+-]\d\.\d\d", text)
    assert re.search(r"\[0 rows, [\d.]+s, [\d,]+ of [\d,]+ prompt tokens cached\]", text), "EXPLAIN ANALYZE, run"
    assert re.search(r"speed of light [\d.]+s", text)
    progress = [int(n.replace(",", "")) for n in re.findall(r"after [\d.]+s: ([\d,]+) of", text)]
    assert len(progress) >= 2 and progress == sorted(progress) and progress[-1] > 0, "quail_queries showed progress"
    assert "the client had OperationalError: CANCELLED" in text and "quail_queries no longer lists it" in text
    assert len(re.findall(r'\| \{"order":"', text)) == 4, "AI_EXTRACT's JSON fields, a row per ticket"
    assert "-- 5. A summary" in text and "    (2 rows)" in text.split("-- 5.")[1], "AI_AGG: a row per product"
    assert "server stopped" in text
