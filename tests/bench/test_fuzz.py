"""A bounded fuzzing run against a real server (bench/fuzz.py): generated and mutated statements, the
relational ones checked against DuckDB. No death, no internal error, no wrong result, no silent repair."""

from __future__ import annotations

from bench.fuzz import Fuzzer

SECONDS = 8


def test_a_fuzzing_run_finds_nothing(tmp_path):
    fuzzer = Fuzzer(tmp_path, seed=20)
    fuzzer.start()
    try:
        outcome = fuzzer.run(SECONDS)
    finally:
        fuzzer.stop()
    assert outcome.statements > 100 and outcome.statuses["OK"] > 20 and outcome.statuses["INVALID_ARGUMENT"] > 20
    assert {"relational", "ai", "mutated-relational"} <= set(outcome.kinds)
    assert (outcome.deaths, outcome.internal, outcome.wrong, outcome.repairs) == (0, 0, 0, 0), outcome.findings
