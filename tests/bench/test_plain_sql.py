"""The plain-SQL benchmark at a tiny scale on the CPU: a check of the script and its result file, not a timing.
DuckDB in-process is the reference and must agree with itself run to run; Quail must start and be measured;
roapi is measured where its binary is installed and otherwise listed as skipped with the reason."""

from __future__ import annotations

import json

from bench import plain_sql

TOP = {"device", "date", "git_commit", "command", "versions", "rows", "repeat", "engines", "floors"}
PER_ENGINE = {"round_trip_ms", "suite_s", "suite_total_s", "agg_10m_s", "agree", "big_create_s", "errors"}


def test_plain_sql_writes_every_engines_figures(tmp_path):
    out = tmp_path / "plain.json"
    assert plain_sql.main(["--rows", "20000", "--repeat", "5", "--out", str(out)]) == out
    doc = json.loads(out.read_text())
    assert TOP <= set(doc)
    assert (doc["rows"], doc["repeat"]) == (20000, 5)
    assert {"duckdb", "pyarrow", "adbc_driver_flightsql"} <= set(doc["versions"])
    engines = doc["engines"]
    assert {"duckdb", "quail", "roapi"} <= set(engines)
    for name in ("duckdb", "quail"):
        assert PER_ENGINE <= set(engines[name]), name
        assert set(engines[name]["round_trip_ms"]) == {"select_1", "point_lookup"}, name
        assert set(engines[name]["suite_s"]) == set(plain_sql.SUITE), name
    duckdb = engines["duckdb"]
    assert duckdb["agree"] is True and duckdb["errors"] == {}
    assert all(seconds > 0 for seconds in duckdb["suite_s"].values())
    assert duckdb["round_trip_ms"]["point_lookup"]["p90"] >= duckdb["round_trip_ms"]["point_lookup"]["p50"] > 0
    assert set(engines["quail"]["added_ms_over_duckdb"]) == {"select_1", "point_lookup"}
    assert "skipped" in engines["roapi"] or PER_ENGINE <= set(engines["roapi"])
    assert set(doc["floors"]) == {"grpcio", "pyarrow"}
    for floor in doc["floors"].values():  # each floor served its one row to the real driver
        assert floor["round_trip_ms"]["select_1"]["p90"] >= floor["round_trip_ms"]["select_1"]["p50"] > 0
