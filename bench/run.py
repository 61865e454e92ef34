"""The benchmark harness: every query through the public Python API, every engine, one JSON file.

    python -m bench.run --scale 0.1 --model dummy:qwen3-4b --device cuda --precision bf16 \\
        --decisions hash --sol-device h200 --engines quail,naive,prefix,hf --out bench/results

Engines share the loaded weights: `quail` (the runtime as shipped), `naive`
(independent full prompts), `prefix` (block-hash prefix caching in arrival
order), `hf` (HF transformers, padded batches). `vllm` is not available in this
version: asking for it is refused with the other arguments. The result file holds
the fields BENCHMARK.md names, per query and engine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import platform
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any


import quail
from quail.engine.ai.asking import Question, yes_probabilities
from quail.engine.errors import QuailError
from quail.engine.model.config import ATTENTION
from quail.engine.runtime.loading import DEFAULT_MODEL
from quail.engine.runtime.runtime import Runtime
from quail.planner.cost import DEVICES

from .baselines import hf_strategy
from .provenance import device_name, git_commit
from .datagen import CORPORA, Workload, generate

QUERY_DIR = Path(__file__).parent / "queries"
ALL_QUERIES = ["F1", "F3", "J1", "JF", "J2A", "J3", "JEQ", "CIN", "BIG", "AG"]
ENGINES = ["quail", "naive", "prefix", "hf"]
TABLE_CORPUS = {"reviews": "reviews", "aspects": "reviews", "reports": "reports", "terms": "reports",
                "claims": "claims", "evidence": "claims", "traces": "traces"}


def query_text(name: str) -> str:
    """A query file's SQL without its comment lines."""
    lines = (QUERY_DIR / f"{name}.sql").read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("--")).strip()


def corpora_for(queries: list[str]) -> list[str]:
    used = set()
    for name in queries:
        words = set(re.findall(r"[a-z_]+", query_text(name).lower()))
        used |= {corpus for table, corpus in TABLE_CORPUS.items() if table in words}
    return [c for c in CORPORA if c in used]


def agreement(rows: list[tuple], reference: list[tuple]) -> float:
    """Fraction of rows equal between an engine and quail (multiset overlap over the larger side)."""
    if not rows and not reference:
        return 1.0
    overlap = sum((Counter(rows) & Counter(reference)).values())
    return overlap / max(len(rows), len(reference))


def engine_runtimes(base: Runtime, engines: list[str]) -> dict[str, Runtime]:
    out = {}
    for engine in engines:
        if engine == "quail":
            out[engine] = base
        elif engine == "hf":
            out[engine] = base.variant(hf_strategy(base.runner.model))
        else:
            out[engine] = base.variant(engine)
    return out


def run_query(session: quail.Session, sql: str) -> tuple[list[tuple], quail.Report]:
    result = session.sql(sql).run()
    table = result.collect()
    return list(zip(*(column.to_pylist() for column in table.columns))), result.report


def figures(rows: list[tuple], report: quail.Report, usd_per_hour: float) -> dict[str, Any]:
    wall = report.wall_s
    return {
        "wall_s": wall, "rows": len(rows),
        "logical_tokens": report.logical_tokens,
        "logical_tokens_per_s": report.logical_tokens / wall if wall else None,
        "logical_tokens_per_min": 60 * report.logical_tokens / wall if wall else None,
        "physical_tokens": report.physical_tokens, "fresh_tokens": report.fresh_tokens,
        "padded_tokens": report.padded_tokens, "cached_tokens": report.cached_tokens,
        "kv_regret_tokens": report.kv_regret_tokens, "requests": report.requests,
        "forward_passes": report.forward_passes, "sol_s": report.sol_s, "sol_fraction": report.sol_fraction,
        "usd": wall / 3600 * usd_per_hour, "stages": report.stages,
    }


def run_engines(query: str, sql: str, sessions: dict[str, quail.Session], usd_per_hour: float) -> dict[str, Any]:
    """Each engine's figures for one query; quail runs first and once, its rows the reference."""
    engines: dict[str, Any] = {}
    reference = None
    for engine, session in sessions.items():
        if session.runtime.runner.tree is not None:
            session.runtime.runner.tree.clear()  # each figure is one query's: no KV from those before
        started = time.perf_counter()
        rows, report = run_query(session, sql)
        if engine == "quail":
            reference = rows
        out = figures(rows, report, usd_per_hour)
        out["agree"] = agreement(rows, reference) if reference is not None else None
        engines[engine] = out
        print(f"{query} {engine}: {out['wall_s']:.2f}s rows={out['rows']} agree={out['agree']} "
              f"logical={out['logical_tokens']} fresh={out['fresh_tokens']} "
              f"sol={out['sol_fraction']} ({time.perf_counter() - started:.1f}s)", file=sys.stderr)
    return engines


def warm_up(runtime: Runtime) -> None:
    """The runtime's warm-up passes and one question through the tokenizer, so no engine pays for
    first-call setup."""
    runtime.warm_up()
    yes_probabilities(runtime, Question("Is {0} short?"), [["warm-up text"]])


def write_json(path: Path, doc: dict) -> Path:
    """A result document written to `path` (its folder made), indented; the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ["torch", "transformers", "pyarrow", "duckdb", "sqlglot", "tokenizers", "quail-server"]:
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "absent"
    return out


def short_device(name: str) -> str:
    """A device name as the result file's name holds it: `cpu`, the GPU's model (`h100` for "NVIDIA H100 80GB
    HBM3", `a100` for "NVIDIA A100-SXM4-80GB"), else `gpu`."""
    if name.startswith("CPU"):
        return "cpu"
    model = re.search(r"\b([a-z]+\d+)", name.lower().removeprefix("nvidia "))
    return model.group(1) if model else "gpu"


def weights(model: str | None, model_id: str) -> str:
    """What `--model` loaded, for the result file: `dummy`, the embedded default by its model id, or the HF
    directory, HF repo id or GGUF path given."""
    if model and model.startswith("dummy:"):
        return "dummy"
    if model in (None, DEFAULT_MODEL, "default"):
        return f"embedded {model_id}"
    return model


def run(args: argparse.Namespace) -> Path:
    started = time.perf_counter()
    workload = Workload(args.scale, args.seed, args.length_scale)
    tables = generate(workload, corpora_for(args.queries))
    phases = {"data_s": time.perf_counter() - started}
    config = quail.EngineConfig(model=args.model, device=args.device, precision=args.precision,
                                token_budget=args.token_budget, decisions=args.decisions,
                                tokenizer=args.tokenizer, sol_device=args.sol_device, kv_cache_bytes=args.kv_cache_bytes,
                                attention=args.attention, compile={"auto": None, "on": True, "off": False}[args.compile])
    base = quail.Session(config).runtime
    phases["model_s"] = time.perf_counter() - started - phases["data_s"]
    # HF transformers has no fp8 path of ours: the hf baseline runs only in fp32 and bf16.
    runtimes = engine_runtimes(base, [e for e in args.engines if not (e == "hf" and args.precision == "fp8")])
    sessions = {}
    for engine, runtime in sorted(runtimes.items(), key=lambda item: item[0] != "quail"):
        warm_up(runtime)
        sessions[engine] = quail.Session(config, runtime=runtime)
        for name, table in tables.items():
            sessions[engine].register(name, table)
    phases["warm_up_s"] = time.perf_counter() - started - phases["data_s"] - phases["model_s"]
    print("start: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()), file=sys.stderr)
    results: dict[str, Any] = {}
    now = dt.datetime.now(dt.timezone.utc)
    commit = args.git_commit or git_commit()
    model_name = (args.model or DEFAULT_MODEL).removeprefix("dummy:").replace("/", "_")
    device = device_name(args.device)
    document = {
        "device": device, "model": model_name, "precision": args.precision,
        "weights": weights(args.model, base.model_id),
        "decisions": args.decisions, "scale": args.scale, "length_scale": args.length_scale, "seed": args.seed,
        "git_commit": commit, "date": now.isoformat(timespec="seconds"), "command": " ".join(sys.argv),
        "versions": versions(), "usd_per_gpu_hour": args.usd_per_gpu_hour, "token_budget": args.token_budget,
        "compiled": config.compiled, "attention": config.attention_layout,
        "kv_cache_bytes": base.runner.pool.capacity_bytes,
        "sol_device": args.sol_device or ("cpu" if args.device == "cpu" else None),
        "table_rows": {name: t.num_rows for name, t in tables.items()},
        "engines_absent": [e for e in args.engines if e not in sessions], "start": phases,
        "queries": results,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    path = out_dir / f"{now:%Y-%m-%d}-{short_device(device)}-{model_name}-{args.precision}-{commit[:7]}{tag}.json"
    for query in args.queries:
        sql = query_text(query)
        try:
            results[query] = {"sql": sql, "engines": run_engines(query, sql, sessions, args.usd_per_gpu_hour)}
        except QuailError as err:
            results[query] = {"sql": sql, "engines": {}, "error": str(err)}
            print(f"{query}: not run: {err}", file=sys.stderr)
        path.write_text(json.dumps(document, indent=1, default=float) + "\n")  # after each query: a cut run keeps its part
    return path


def engine_list(text: str) -> list[str]:
    """`--engines`: the engines named, each one this version can run."""
    engines = text.split(",")
    if "vllm" in engines:
        raise argparse.ArgumentTypeError(
            f"the vllm engine is not available in this version; the engines are {', '.join(ENGINES)}")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown engines {unknown}; the engines are {', '.join(ENGINES)}")
    return engines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--length-scale", type=float, default=1.0, help="multiply text lengths (1.0: bench/BENCHMARK.md's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="model name (default: embedded SmolLM2) or dummy:<shape>")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer directory for dummy weights")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp8"])
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="compile the layers' token-wise parts (auto: on CUDA)")
    p.add_argument("--decisions", default="model", choices=["model", "hash"])
    p.add_argument("--token-budget", type=int, default=4096)
    p.add_argument("--sol-device", default=None, choices=sorted(DEVICES))
    p.add_argument("--kv-cache-bytes", type=int, default=None,
                   help="the KV pool, where a query's computed prompts stay for its later steps (default: 1 GiB on "
                        "the CPU; on a GPU, 90%% of the memory the weights and a pass leave free; 0: nothing stays); emptied before each query")
    p.add_argument("--attention", default=None, choices=ATTENTION,
                   help="own-token attention: rows padded per length bucket (cuDNN), or one flash varlen "
                        "call (default: varlen on CUDA in bf16/fp8)")
    p.add_argument("--usd-per-gpu-hour", type=float, default=3.95)
    p.add_argument("--queries", type=lambda s: s.split(","), default=ALL_QUERIES)
    p.add_argument("--engines", type=engine_list, default=ENGINES,
                   help=f"a comma-separated list of {', '.join(ENGINES)} (vllm is not available in this version)")
    p.add_argument("--git-commit", default=None, help="the commit measured (default: git rev-parse HEAD)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--tag", default="", help="appended to the result file's name (a variant of one commit)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    unknown = [q for q in args.queries if q not in ALL_QUERIES]
    if unknown:
        raise SystemExit(f"unknown queries: {unknown}")
    print(run(args))


if __name__ == "__main__":
    main()
