"""The client examples (clients/*_example.py) run against a real server, as a user would run them."""

from __future__ import annotations

from quail.clients import dataframes_example


def test_pandas_writes_a_dataframe_and_reads_ai_sql_back(server):
    scored = dataframes_example.with_pandas(server.uri)
    assert sorted(scored["id"]) == [1, 2, 3, 4] and list(scored.columns) == ["id", "complaint", "text"]
    assert scored["complaint"].between(0, 1).all() and scored["complaint"].is_monotonic_decreasing


def test_polars_writes_a_dataframe_and_reads_ai_sql_back(server):
    """polars writes string_view columns: the planner's look at the KV pool reads them too."""
    labelled = dataframes_example.with_polars(server.uri)
    assert labelled["id"].to_list() == [1, 2, 3, 4] and labelled.columns == ["id", "topic", "text"]
    assert set(labelled["topic"].to_list()) <= {"billing", "bug report", "delivery", "praise"}


def test_the_script_prints_both(server, capsys):
    dataframes_example.main(server.uri)
    out = capsys.readouterr().out
    assert "complaint" in out and "topic" in out
