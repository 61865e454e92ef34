"""A bounded fuzzing run against a real server (bench/fuzz.py): generated and mutated statements, the
relational ones checked against DuckDB. No death, no internal error, no wrong result, no silent repair."""

from __future__ import annotations

from bench.fuzz import Fuzzer

STATEMENTS = 70  # the seed's first ones, whatever the machine's speed


def test_a_fuzzing_run_finds_nothing(tmp_path):
    fuzzer = Fuzzer(tmp_path, seed=20)
    fuzzer.start()
    try:
        outcome = fuzzer.run(600, statements=STATEMENTS)
    finally:
        fuzzer.stop()
    assert outcome.statements == STATEMENTS
    assert outcome.statuses["OK"] > 20 and outcome.statuses["INVALID_ARGUMENT"] > 20
    assert {"relational", "ai", "mutated-relational"} <= set(outcome.kinds)
    assert (outcome.deaths, outcome.internal, outcome.wrong, outcome.repairs) == (0, 0, 0, 0), outcome.findings


def test_every_hostile_call_gets_an_allowed_status_and_the_server_serves_on(tmp_path):
    """bench/hostile.py's calls (huge statements and messages, long stop lists, 40,000-term conditions, odd
    Arrow types, deep response formats, session floods, foreign tickets), each once, against a real server."""
    from bench.hostile import HOSTILE

    fuzzer = Fuzzer(tmp_path, seed=3)
    fuzzer.start()
    try:
        for name in sorted(HOSTILE):
            fuzzer.hostile(name)
        fuzzer.one("relational", "SELECT count(*) AS n FROM t1")
    finally:
        fuzzer.stop()
    outcome = fuzzer.outcome
    assert (outcome.deaths, outcome.internal, outcome.wrong) == (0, 0, 0), outcome.findings
    assert outcome.statuses["OK"] >= 2 and outcome.statuses["RESOURCE_EXHAUSTED"] >= 3
