"""The shared-server workload runs every phase against a real server through ADBC (tiny sizes, the
embedded model): each phase's statements ran and the server's counters moved, the device's busy share
among them."""

from __future__ import annotations

import json

from bench import server_load


def test_every_phase_runs_and_reads_the_servers_counters(tmp_path):
    out = tmp_path / "load.json"
    server_load.main(["--reviews", "200", "--tokens", "16", "--a-rows", "12", "--b-statements", "2", "--rows", "3",
                      "--clients", "2", "--d-rows", "4", "--e-rows", "24", "--e-statements", "2", "--e-delay", "0.5",
                      "--flush-rows", "6", "--firsts", "2", "--first-gap", "0.1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["device"].startswith("CPU") and result["git_commit"]  # where the figures came from
    phases = result["phases"]
    assert set(phases) == {"A", "B", "C", "D", "E_idle", "E", "F", "G", "F_late", "G_late", "E_idle_firsts", "E_firsts",
                           "flush", "F_flushed"}
    firsts, idle = phases.pop("E_firsts"), phases.pop("E_idle_firsts")  # latencies alone, no counters
    assert idle["statements"] == 2 and len(firsts["latencies_s"]) == firsts["statements"] >= 1
    assert firsts["against_idle"] == round(firsts["latency_p50_s"] / idle["latency_p50_s"], 2)
    assert len(firsts["connect_s"]) == firsts["statements"] and len(idle["connect_s"]) == 2
    assert firsts["connect_against_idle"] == round(firsts["connect_p50_s"] / idle["connect_p50_s"], 2)
    assert [phases[p]["statements"] for p in ("A", "B", "C", "D", "E")] == [1, 2, 4, 2, 2]
    for name, figures in phases.items():
        assert figures["logical_tokens"] >= figures["fresh_tokens"] > 0, name
        assert figures["logical_tokens"] == figures["fresh_tokens"] + figures["cached_tokens"], name
        assert 0 < figures["device_busy"] <= (1.2 if name == "E" else 1.0), name  # E: the long one's passes too
        assert figures["host_restored_tokens"] == figures["disk_restored_tokens"] == 0, name  # no tiers on a CPU
    assert phases["B"]["against_A"] > 0 and phases["E"]["against_idle"] > 0 and phases["F_late"]["against_F"] > 0
    assert phases["F_late"]["other_fresh_tokens"] == sum(phases[p]["fresh_tokens"] for p in ("B", "C", "D", "E_idle", "E"))
    latencies = phases["C"]["latencies_s"]
    assert len(latencies) == 4 and latencies == sorted(latencies)
    assert abs(latencies[-1] - phases["C"]["latency_max_s"]) <= 0.001
