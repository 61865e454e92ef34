"""A short stress run (bench/stress.py): clients at once on a server short of KV, some cancelling their
statements, a table rewritten beside them; every statement's rows as alone, and no KV held once all end."""

from __future__ import annotations

from bench.stress import run


def test_a_short_stress_run_on_a_pool_smaller_than_a_pass_finds_nothing():
    """A pool of 100 tokens, below a pass's 256, and a host tier of 400: passes keep their KV in pools of their
    own, what the pool lets go of is dropped or moved, and generation computes again the prompts the tree
    could not keep."""
    outcome = run(clients=4, statements=3, seed=4, pool_tokens=100, host_tokens=400)
    assert outcome.clean(), outcome.findings
    assert outcome.answered >= 8 and outcome.cancelled >= 1, outcome
    short = outcome.kv["quail_kv_evicted_tokens_total"] + outcome.kv["quail_kv_host_offloaded_tokens_total"]
    assert short > 0, "the pool was too small for the statements"
