"""The statement-timeline probe times a real `quail serve` through ADBC (tiny sizes, the embedded model): every
statement's spans from its prepare to the next, the device's among them, and each span's median."""

from __future__ import annotations

from bench.probes import statement_timeline


def test_the_probe_lists_a_statements_spans_and_their_medians_beside_a_long_one(tmp_path):
    """Beside a long statement, new questions (a new shape each, as server_load's E_firsts) 0.1 s apart: each
    statement's spans in order, each cycle holding the gap after it, the spans' medians slowest first, the
    threads' sampled places among them."""
    out = tmp_path / "timeline.txt"
    statement_timeline.main(["--out", str(out), "--reviews", "200", "--row-tokens", "16", "--rows", "2",
                             "--statements", "6", "--warm-rows", "6", "--beside-rows", "60", "--new-questions",
                             "--gap", "0.1"])
    head, text = out.read_text().split("\n\n", 1)
    assert head.startswith("quail serve : 6 statements of 2 rows") and "beside a statement of 60 rows" in head
    assert "each a new question, 0.1 s apart" in head
    cycles = [float(line.split()[1]) for line in text.splitlines() if line.startswith("cycle")]
    assert cycles and all(ms >= 100 for ms in cycles), "a statement's cycle holds the gap after it"
    listed, medians = text.split("median ms per statement over ")
    spans = [line.split()[-1] for line in listed.splitlines() if line and not line.startswith("cycle")]
    assert spans[:2] == ["FlightSQLHandler.do_action", "QueryService.plan"], "a statement starts at its prepare"
    for span in ("TreeJob.__init__", "Rows.build", "PassScheduler._forward", "FlightSQLHandler.do_get", "QueryService.report"):
        assert span in spans, span
    assert medians.startswith("2\n"), "the second half of the timed statements, the last one open-ended"
    table = medians.split("\nclient p50")[0].splitlines()[1:]  # "<ms>  <span>" lines, before the client's figure
    listed_ms = [float(line.split()[0]) for line in table]
    assert listed_ms == sorted(listed_ms, reverse=True), "slowest first"
    assert "cycle" in [line.split()[-1] for line in table]
    assert any("  @ " in line and ".py:" in line for line in table), "where the threads stood, sampled and summed"
    assert "client p50" in text
    assert statement_timeline.WAITED in medians and statement_timeline.COMPUTED in medians

