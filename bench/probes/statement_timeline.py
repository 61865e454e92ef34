"""Where a short statement's time goes inside `quail serve`: each span of its server-side work, in order.

    python -m bench.probes.statement_timeline --out bench/results/<date>-<device>-statement-timeline-<sha>.txt \\
        -- --model dummy:qwen3-4b --tokenizer .offline/tokenizer --device cuda --precision bf16 --token-budget 16384

Runs `quail serve` (through this module, which first wraps the functions of SPANS with timers: each call's
start and end and its thread; a generator's each item; the interpreter's garbage collections; where the
device's owner loop stands, and each other thread not waiting, sampled every millisecond: `@ file:line
function`, summed as spans), ingests `--reviews` reviews over ADBC and waits for their tokenizing, runs a
`--warm-rows`-row statement (with `--as-phase-b`, as server_load's A, F and G: it, it again, and another
question over its rows) and ten short ones to warm up, then `--statements` statements of `--rows` rows one
after another on one ADBC connection, as bench/server_load.py's phase B (with `--beside-rows`, beside a long
statement started before them, as its phase E; with `--new-questions` and a `--gap` past the scheduler's short
window, as its E_firsts: each a question not asked before). Writes a text file: the spans of `--show`
statements (start ms, end ms, duration ms, thread, span; times from the statement's CreatePreparedStatement,
spans under 0.01 ms and samples of one place under 2 ms in a row left out), then each span's median total per
statement over the second half of the statements (with the time from a statement's answers to the client's
next prepare, from its job handed to the scheduler to the start of the next pass's filling, and from there to
its answers), and the client's median latency. The timers cost microseconds a call: compare such timelines
with each other, not with the benchmark's figures.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import functools
import gc
import importlib
import inspect
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import adbc_driver_flightsql.dbapi as flight_sql

from bench.datagen import numbered_reviews
from bench.server_load import QUESTIONS, Counters, run, statement
from quail.clients.server_process import ServerProcess, free_port

EVENTS_ENV = "QUAIL_TIMELINE_EVENTS"  # where the traced server writes its spans as it exits
PREPARE, PLAN = "FlightSQLHandler.do_action", "QueryService.plan"  # a statement starts at the prepare that plans
ANSWERS, AFTER = "Scoring.read", "from its answers to the next prepare"  # the tail after the device's work
BESIDE_DELAY_S = 2.0  # from the statement beside to the first measured one (its first passes under way)
QUEUED = "PassScheduler.run"  # a job handed to the scheduler
PASSES = ("PassScheduler._pass", "PassScheduler._inner_pass")  # a pass being filled (or one cut into it)
SAMPLED, SAMPLE, SAMPLE_S = "quail-scheduler", "@ ", 0.001  # the owner loop's thread, samples' prefix, period
WAITS = {"wait", "_wait_once", "_wait", "get", "select", "poll", "sleep", "acquire", "_acquire_restore", "accept",
         "readline", "read", "recv", "_recv", "result", "next", "__next__", "_next", "_reached", "synchronize",
         "_worker", "_loop", "serve", "_serve", "wait_for", "_wait_for_tstate_lock", "join", "_handle_call"}
WAITED, COMPUTED = "from its job queued to its pass filled", "from its pass filled to its answers"

SPANS: list[tuple[str, str | None, list[str]]] = [  # module, class (None: the module's functions), functions
    ("quail.server.flight_sql", "FlightSQLHandler", ["do_action", "get_flight_info", "do_get", "_stream"]),
    ("quail.server.query_service", "QueryService", ["plan", "report"]),
    ("quail.server.query_service", None, ["plan_statement", "result_schema", "execute_stream"]),
    ("quail.server.metrics", "Metrics", ["query_done"]),
    ("quail.planner.planner", None, ["bind_core", "optimize", "emit"]),
    ("quail.engine.exec.executor", None, ["_chunks", "_run_step", "_asking_together", "_answered", "_values"]),
    ("quail.engine.exec.relational", "DuckDB", ["run"]),
    ("quail.engine.ai.asking", None, ["build_requests", "_probabilities"]),
    ("quail.engine.ai.asking", "Asking", ["read"]),
    ("quail.engine.runtime.runtime", "Runtime", ["segments", "launch", "forget"]),
    ("quail.engine.runtime.runtime", "Scoring", ["read"]),
    ("quail.engine.runtime.scheduler", "PassScheduler", ["run", "_pass", "_inner_pass", "_forward"]),
    ("quail.engine.runtime.pacing", "Pacing", ["wait"]),
    ("quail.engine.runtime.tree_job", "TreeJob", ["__init__", "fill", "rows", "take"]),
    ("quail.engine.runtime.tree_job", "_Hold", ["claim", "release"]),
    ("quail.engine.runtime.tree_job", None, ["_roots"]),
    ("quail.engine.runtime.model_runner", "ModelRunner", ["_inputs", "answer_logprobs"]),
    ("quail.engine.runtime.model_runner", None, ["_keeping", "on_device", "on_device_all", "runs_of"]),
    ("quail.engine.kv.pool", "KVPool", ["take"]),
    ("quail.engine.kv.resident", "ResidentTree", ["evict", "demote_noted"]),
    ("quail.engine.kv.runs", "KVLedger", ["keep_each"]),
    ("quail.engine.kernels.attention", "Rows", ["build"]),
    ("quail.engine.kernels.attention", None, ["_buckets", "_packed", "_run_arrays", "query_blocks", "on_device",
                                              "on_device_all"]),
]
NAMED: dict[str, Callable[..., str]] = {  # a span's name given what it was called with
    "Pacing.wait": lambda pacing: f"Pacing.wait lead {pacing.lead}",  # the layers the host queues ahead
}


def _timed(fn: Callable, name: str, events: list) -> Callable:
    """`fn` recording (name, thread, start, end) per call, or per item of the generator it returns."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def items(*args: Any, **kwargs: Any):
            inner = fn(*args, **kwargs)
            while True:
                start = time.perf_counter()
                try:
                    item = next(inner)
                except StopIteration:
                    events.append((f"{name}.end", threading.current_thread().name, start, time.perf_counter()))
                    return
                events.append((f"{name}.next", threading.current_thread().name, start, time.perf_counter()))
                yield item
        return items

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any):
        start, named = time.perf_counter(), NAMED[name](*args) if name in NAMED else name
        try:
            return fn(*args, **kwargs)
        finally:
            events.append((named, threading.current_thread().name, start, time.perf_counter()))
    return call


def _where(frame: Any) -> str:
    """Where a sampled thread stands: its innermost frame in Quail's code, and the innermost frame of all
    (a library's call it waits in) where that is another."""
    inner, ours = frame, None
    while frame is not None and ours is None:
        if frame.f_globals.get("__name__", "").startswith("quail."):
            ours = frame
        frame = frame.f_back

    def name(f: Any) -> str:
        return f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}"
    return name(ours or inner) + ("" if ours is None or ours is inner else f" < {name(inner)}")


def _sample(events: list) -> None:
    """Every SAMPLE_S, where the device's owner loop stands (`SAMPLED`), and each other thread not waiting
    (its innermost frame not one of WAITS: running Python, or in a call that may hold the interpreter's
    lock), as a span of SAMPLE_S named SAMPLE + its place: summed per statement, each place's share of the
    thread's time (the owner loop's waits included)."""
    me = threading.get_ident()
    while True:
        time.sleep(SAMPLE_S)
        threads = {thread.ident: thread.name for thread in threading.enumerate()}
        now = time.perf_counter()
        for ident, frame in sys._current_frames().items():
            name = threads.get(ident, "?")
            if ident != me and (name == SAMPLED or frame.f_code.co_name not in WAITS):
                events.append((SAMPLE + _where(frame), name, now - SAMPLE_S, now))


def _traced_serve(argv: list[str]) -> int:
    """`quail serve` with SPANS timed and collections recorded; the spans written to $QUAIL_TIMELINE_EVENTS
    as it exits."""
    events: list = []
    for module, owner_name, names in SPANS:
        owner = importlib.import_module(module)
        owner = getattr(owner, owner_name) if owner_name else owner
        for name in names:
            if hasattr(owner, name):  # a span the served version lacks is left out (comparing versions)
                setattr(owner, name, _timed(getattr(owner, name), f"{owner_name or module.rsplit('.', 1)[1]}.{name}",
                                            events))
    started: dict[str, float] = {}

    def collected(phase: str, info: dict) -> None:
        if phase == "start":
            started["at"] = time.perf_counter()
        else:
            events.append((f"gc{info['generation']}", threading.current_thread().name, started["at"],
                           time.perf_counter()))

    gc.callbacks.append(collected)
    threading.Thread(target=_sample, args=(events,), name="timeline-sampler", daemon=True).start()
    atexit.register(lambda: Path(os.environ[EVENTS_ENV]).write_text(json.dumps(events)))
    from quail.cli import main
    return main(argv)


def _merged_samples(events: list) -> list:
    """The events, each run of samples of one place in a row on one thread as one span (a sample apart)."""
    out: list = []
    last: dict[str, int] = {}  # each thread's latest sample, by its index in `out`
    for name, thread, t0, t1 in sorted(events, key=lambda e: e[2]):
        if not name.startswith(SAMPLE):
            out.append((name, thread, t0, t1))
            continue
        k = last.get(thread)
        if k is not None and out[k][0] == name and t0 - out[k][3] < SAMPLE_S:
            out[k] = (name, thread, out[k][2], t1)
        else:
            last[thread] = len(out)
            out.append((name, thread, t0, t1))
    return out


def timeline(events: list, count: int, show: int) -> str:
    """Of the last `count` statements (a statement: from its planning prepare to the next's), the spans of
    `show` from the middle, then each span's median total per statement over the second half, and the
    median time from a statement's answers on the host (its last `Scoring.read`) to the next prepare.

    - A span counts toward the statement it starts in, up to that statement's end: a pass of a statement
      beside that runs on past it is not charged to this one in full."""
    events = sorted(_merged_samples(events), key=lambda e: e[2])
    plans = [e[2] for e in events if e[0] == PLAN]
    starts = [e[2] for e in events if e[0] == PREPARE and any(e[2] <= p <= e[3] for p in plans)][-count:]
    half = range(len(starts) // 2, len(starts) - 1)
    totals: dict[str, list[float]] = collections.defaultdict(list)
    lines = []
    for k in half:
        begin, end = starts[k], starts[k + 1]
        sums: dict[str, float] = collections.defaultdict(float)
        answered, own = None, None  # the end of the statement's last ANSWERS span, and its thread
        queued: dict[str, float] = {}  # each thread's first QUEUED start (a statement beside runs on others)
        passes: list[float] = []  # the starts of PASSES' spans (in the order they ended)
        for name, thread, t0, t1 in events:
            if begin <= t0 < end:
                sums[name] += (min(t1, end) - t0) * 1000
                if name == ANSWERS and (answered is None or t1 > answered):
                    answered, own = t1, thread
                if name == QUEUED:
                    queued.setdefault(thread, t0)
                if name in PASSES:
                    passes.append(t0)
                if k < half.start + show and t1 - t0 >= (2 * SAMPLE_S if name.startswith(SAMPLE) else 1e-5):
                    lines.append(f"{(t0 - begin) * 1000:8.2f} {(t1 - begin) * 1000:8.2f} {(t1 - t0) * 1000:7.2f}  "
                                 f"{thread[:18]:18s} {name}")
        sums["cycle"] = (end - begin) * 1000
        if answered is not None:
            sums[AFTER] = (end - answered) * 1000
        if own in queued:  # its job, and the first pass filled after it came
            filled = min((t0 for t0 in passes if t0 >= queued[own]), default=None)
            if filled is not None:
                sums[WAITED], sums[COMPUTED] = (filled - queued[own]) * 1000, (answered - filled) * 1000
        if k < half.start + show:
            lines += [f"cycle {sums['cycle']:.2f}", ""]
        for name, ms in sums.items():
            totals[name].append(ms)
    lines.append(f"median ms per statement over {len(half)}")
    lines += [f"{statistics.median(ms):8.2f}  {name}"
              for name, ms in sorted(totals.items(), key=lambda item: -statistics.median(item[1]))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        sys.exit(_traced_serve(argv))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the text file to write")
    ap.add_argument("--reviews", type=int, default=5000)
    ap.add_argument("--row-tokens", type=float, default=300.0, help="mean tokens of a review")
    ap.add_argument("--rows", type=int, default=20, help="rows of each statement")
    ap.add_argument("--statements", type=int, default=60)
    ap.add_argument("--warm-rows", type=int, default=640, help="rows of the statement that warms the server up")
    ap.add_argument("--as-phase-b", action="store_true",
                    help="warm up as bench/server_load.py's phases A, F and G before its B: the warm statement, "
                         "the same again, then another question over its rows")
    ap.add_argument("--show", type=int, default=1, help="statements whose spans are listed")
    ap.add_argument("--beside-rows", type=int, default=0,
                    help="rows of a statement started, on a connection of its own, before the statements (a long "
                         "scan beside them, as bench/server_load.py's phase E; its spans count in theirs)")
    ap.add_argument("--new-questions", action="store_true",
                    help="each measured statement a question not asked before (a new shape, as server_load's E_firsts)")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="seconds between the measured statements (past the scheduler's short window, each finds "
                         "the passes of the statement beside as they are alone)")
    ap.add_argument("serve_args", nargs="*", help="after --: arguments for quail serve")
    args = ap.parse_args(argv)
    metrics = free_port()
    with tempfile.TemporaryDirectory() as data:
        events_path = Path(data) / "events.json"
        os.environ[EVENTS_ENV] = str(events_path)
        with ServerProcess(Path(data) / "tables", "--metrics-port", str(metrics), *args.serve_args,
                           module="bench.probes.statement_timeline") as server:
            with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
                cur.adbc_ingest("reviews", numbered_reviews(args.reviews, args.row_tokens), mode="create")
            Counters(metrics).warmed()
            warm = args.reviews - args.warm_rows
            phases = [statement(warm, args.warm_rows)] * (2 if args.as_phase_b else 1)
            if args.as_phase_b:
                phases.append(statement(warm, args.warm_rows, QUESTIONS[1]))
            run(server.uri, phases + [statement(args.rows * k, args.rows) for k in range(10)])
            first = 10 * args.rows
            beside = None
            if args.beside_rows:
                long = statement(first + args.rows * args.statements, args.beside_rows)
                beside = threading.Thread(target=run, args=(server.uri, [long]))
                beside.start()
                time.sleep(BESIDE_DELAY_S)
            questions = [f"Does {{0}} mention the number {k}?" if args.new_questions else QUESTIONS[0]
                         for k in range(args.statements)]
            latencies = run(server.uri, [statement(first + args.rows * k, args.rows, question)
                                         for k, question in enumerate(questions)], args.gap)
            if beside is not None:
                beside.join()
        text = timeline(json.loads(events_path.read_text()), args.statements, args.show)
    besides = f", beside a statement of {args.beside_rows} rows" if args.beside_rows else ""
    besides += ", each a new question" if args.new_questions else ""
    besides += f", {args.gap} s apart" if args.gap else ""
    besides += " (warmed up as server_load's phases A, F and G)" if args.as_phase_b else ""
    head = (f"quail serve {' '.join(args.serve_args)}: {args.statements} statements of {args.rows} rows one after "
            f"another on one ADBC connection{besides};\nstart ms, end ms, duration ms, thread, span, from each "
            f"statement's CreatePreparedStatement\n\n")
    Path(args.out).write_text(f"{head}{text}\nclient p50 {statistics.median(latencies) * 1000:.1f} ms over "
                              f"{len(latencies)} statements of {args.rows} rows\n")
    print(text)


if __name__ == "__main__":
    main()
