"""The benchmark harness at a tiny scale on the CPU: a check of the harness and its file, not a timing."""

from __future__ import annotations

import json

import pytest

from quail import Session
from bench import report, run

REQUIRED = ["device", "model", "precision", "weights", "decisions", "scale", "seed", "git_commit", "date",
            "command", "versions", "usd_per_gpu_hour", "queries"]
FIGURES = ["wall_s", "rows", "agree", "logical_tokens", "physical_tokens", "cached_tokens", "kv_regret_tokens",
           "sol_s", "usd"]


SCALE, LENGTH_SCALE = 0.0002, 0.05  # 10 reviews, 4 traces, texts a twentieth of the benchmark's


def test_harness_writes_a_valid_result_file(tmp_path, runtime):
    run.main(["--scale", str(SCALE), "--length-scale", str(LENGTH_SCALE), "--queries", "AG",
              "--engines", "quail,naive,prefix,hf", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("*-cpu-smollm2-135m-fp32-*.json")
    doc = json.loads(path.read_text())
    for key in REQUIRED:
        assert key in doc, key
    assert doc["weights"] == "embedded smollm2-135m-instruct-q4_1"
    assert set(doc["start"]) == {"data_s", "model_s", "warm_up_s"}
    assert set(doc["queries"]) == {"AG"}
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
    tables = run.generate(run.Workload(SCALE, 0, LENGTH_SCALE), ["traces"])
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


def test_report_takes_the_newest_run_result_file(tmp_path):
    """Without an argument the report reads the run result file with the latest date, passing over the other
    JSON files kept beside the runs (checks, probes, fuzz, soak, server load)."""
    def run_file(name: str, date: str) -> None:
        doc = {"device": "CPU", "model": "m", "weights": "dummy", "precision": "fp32", "decisions": "hash",
               "scale": 0.01, "seed": 0, "git_commit": "abcdef0", "date": date, "queries": {}}
        (tmp_path / name).write_text(json.dumps(doc))

    with pytest.raises(SystemExit, match="no benchmark run result files"):
        report.newest(tmp_path)
    run_file("b-older-run.json", "2026-12-01T10:00:00+00:00")
    run_file("a-newer-run.json", "2026-12-02T10:00:00+00:00")
    (tmp_path / "z-fuzz.json").write_text(json.dumps({"command": "fuzz", "date": "2026-12-03T00:00:00+00:00"}))
    (tmp_path / "z-check.json").write_text(json.dumps({"device": "H200", "model": "m", "paths": {}}))
    (tmp_path / "z-list.json").write_text("[1, 2]")
    (tmp_path / "z-truncated.json").write_text('{"date": ')
    (tmp_path / "z-notes.txt").write_text("not JSON")
    assert report.newest(tmp_path) == tmp_path / "a-newer-run.json"


def test_weights_names_what_was_loaded():
    assert run.weights("dummy:qwen3-4b", "dummy-qwen3-4b") == "dummy"
    for default in [None, "smollm2-135m"]:
        assert run.weights(default, "smollm2-135m-instruct-q4_1") == "embedded smollm2-135m-instruct-q4_1"
    for given, model_id in [("/models/Qwen3-4B", "Qwen3-4B"), ("Qwen/Qwen3-4B", "Qwen--Qwen3-4B"),
                            ("/models/qwen3-4b-q8_0.gguf", "qwen3-4b-q8_0")]:
        assert run.weights(given, model_id) == given


def test_the_file_is_named_for_the_device_that_ran_it():
    """An H100 run measured against the H200's speed of light is an `h100` file (its sol_device says h200)."""
    for name, short in [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
                        ("NVIDIA GeForce RTX 4090", "gpu"), ("CPU (x86_64)", "cpu")]:
        assert run.short_device(name) == short


def test_vllm_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        run.parser().parse_args(["--engines", "quail,vllm"])
    error = capsys.readouterr().err
    assert "the vllm engine is not available in this version" in error
    assert "quail, naive, prefix, hf" in error
    assert run.parser().parse_args(["--engines", "quail,hf"]).engines == ["quail", "hf"]
