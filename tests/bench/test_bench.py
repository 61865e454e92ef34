"""The benchmark harness at a tiny scale on the CPU: a check of the harness and its file, not a timing."""

from __future__ import annotations

import json

from quail import Session
from bench import report, run

REQUIRED = ["device", "model", "precision", "weights", "decisions", "scale", "seed", "git_commit", "date",
            "command", "versions", "usd_per_gpu_hour", "queries"]
FIGURES = ["wall_s", "rows", "agree", "logical_tokens", "physical_tokens", "cached_tokens", "kv_regret_tokens",
           "sol_s", "usd"]


def test_harness_writes_a_valid_result_file(tmp_path, runtime):
    run.main(["--scale", "0.0004", "--length-scale", "0.05", "--queries", "F1,F3,AG",
              "--engines", "quail,naive,prefix,hf", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("*-cpu-smollm2-135m-fp32-*.json")
    doc = json.loads(path.read_text())
    for key in REQUIRED:
        assert key in doc, key
    assert set(doc["start"]) == {"data_s", "model_s", "warm_up_s"}
    assert set(doc["queries"]) == {"F1", "F3", "AG"}
    for query, entry in doc["queries"].items():
        assert set(entry["engines"]) == {"quail", "naive", "prefix", "hf"}, query
        for engine, figures in entry["engines"].items():
            for key in FIGURES:
                assert figures[key] is not None, (query, engine, key)
            assert figures["agree"] == 1.0, (query, engine)
        quail, naive = entry["engines"]["quail"], entry["engines"]["naive"]
        assert quail["logical_tokens"] == naive["logical_tokens"]
        assert quail["kv_regret_tokens"] <= naive["kv_regret_tokens"]
    ag = doc["queries"]["AG"]["engines"]
    assert ag["quail"]["fresh_tokens"] < ag["prefix"]["fresh_tokens"] <= ag["naive"]["fresh_tokens"]

    # The harness records what the Python API reports for the same query over the same data.
    tables = run.generate(run.Workload(0.0004, 0, 0.05), ["traces"])
    session = Session(runtime=runtime)
    for name, table in tables.items():
        session.register(name, table)
    direct = session.sql(run.query_text("AG")).run().report
    recorded = doc["queries"]["AG"]["engines"]["quail"]
    for key in ["requests", "logical_tokens", "fresh_tokens", "cached_tokens", "kv_regret_tokens"]:
        assert recorded[key] == getattr(direct, key), key

    report.main([str(path)])
    assert "| AG | quail |" in path.with_suffix(".md").read_text()
    assert path.with_suffix(".png").stat().st_size > 0
