"""Many clients at once on a server short of KV, checked against each statement run alone.

Several ADBC clients send random AI statements at one `quail serve` whose KV
pool holds a fraction of what they compute (so the resident tree evicts
mid-query and the host tier moves and restores KV): filters, scores, chains of
filters, a score beside a filter, joins, classifications, generation, AI_AGG
over groups, the top rows by score, prepared statements with parameters, generation with the most stop
texts a call may name; some
are cancelled by their client while they run, and a writer rewrites a table
that others read. Then a second server, with room to spare, runs each
statement alone. Judged:

- wrong: a statement's rows differ from its rows alone (scores to 1e-4; a
  statement over the rewritten table may match any version of it);
- error: a statement ended in an error other than the cancel it was sent with;
- held: once every statement has ended, KV still held for a running query
  (`quail_kv_resident_bytes`) or pool pages beyond what the resident tree keeps;
- hung: a client not done within `HANG_S`.

With `--pool-tokens` below a pass's tokens, passes keep their KV in pools of their own and the resident
tree lets go of prompts between their prefill and their decoding.

    python -m bench.stress --clients 8 --statements 10 --seed 1 --out bench/results/<date>-cpu-stress-<sha>.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa

from quail.clients.server_process import ServerProcess, free_port, metric_samples

WORDS = ["soup", "staff", "price", "noise", "view", "bread", "wine", "music", "chair", "table"]
QUESTIONS = ["Is {0} about food?", "Does {0} mention the staff?", "Is {0} positive?", "Is {0} short?"]
VERSIONS = 3  # of the table the writer rewrites
KV_BYTES_PER_TOKEN = 46_080  # the embedded model in fp32: 2 × 30 layers × 3 KV heads × 64 × 4 bytes
POOL_TOKENS, HOST_TOKENS = 700, 3000  # the stressed server's KV pool and host tier, by default
CANCELLED_SHARE = 0.15  # of the statements over the table nobody rewrites
HANG_S = 1200.0


def _text(rng: random.Random, longest: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, longest)))


def tables(seed: int) -> tuple[dict[str, pa.Table], list[pa.Table]]:
    """The tables every statement reads, and the versions of `notes` the writer cycles through."""
    rng = random.Random(seed)
    fixed = {"reviews": pa.table({"id": list(range(120)), "body": [f"{_text(rng, 40)} (#{i})" for i in range(120)]}),
             "topics": pa.table({"id": list(range(5)), "topic": ["food", "service", "price", "noise", "a film"]})}
    notes = [pa.table({"id": list(range(30)), "body": [_text(rng, 30) for _ in range(30)]}) for _ in range(VERSIONS)]
    return fixed, notes


@dataclass(frozen=True)
class Statement:
    """One statement a client sends: its text, its parameters, and when its client cancels it (None: never)."""

    sql: str
    parameters: tuple[int, ...] | None = None
    cancel_after_s: float | None = None

    @property
    def rewritten(self) -> bool:
        """Whether it reads the table the writer rewrites (its rows alone: one set per version)."""
        return " notes " in self.sql


def statement(rng: random.Random) -> Statement:
    """A random statement over small ranges of rows, so that the clients' statements overlap."""
    a = rng.randint(0, 110)
    b = a + rng.randint(0, 12)
    q, q2 = rng.sample(QUESTIONS, 2)
    where = f"r.id BETWEEN {a} AND {b}"
    kind = rng.choice(["filter", "score", "chain", "two", "join", "classify", "complete", "aggregate", "top",
                       "parameters", "notes"])
    if kind == "notes":
        a = rng.randint(0, 25)
        return Statement(rng.choice([
            f"SELECT n.id, AI_SCORE(PROMPT('{q}', n.body)) AS p FROM notes n WHERE n.id BETWEEN {a} AND {a + 6} "
            "ORDER BY 1",
            f"SELECT n.id, n.body, AI_FILTER(PROMPT('{q}', n.body)) AS f FROM notes n WHERE n.id BETWEEN {a} AND "
            f"{a + 6} ORDER BY 1"]))
    sql = {
        "filter": f"SELECT r.id FROM reviews r WHERE {where} AND AI_FILTER(PROMPT('{q}', r.body)) ORDER BY 1",
        "score": f"SELECT r.id, AI_SCORE(PROMPT('{q}', r.body)) AS p FROM reviews r WHERE {where} ORDER BY 1",
        "chain": f"SELECT r.id FROM reviews r WHERE {where} AND AI_FILTER(PROMPT('{q}', r.body)) "
                 f"AND AI_FILTER(PROMPT('{q2}', r.body)) ORDER BY 1",
        "two": f"SELECT r.id, AI_SCORE(PROMPT('{q}', r.body)) AS p, AI_FILTER(PROMPT('{q2}', r.body)) AS f "
               f"FROM reviews r WHERE {where} ORDER BY 1",
        "join": f"SELECT r.id, t.id FROM reviews r JOIN topics t ON AI_FILTER(PROMPT('Is {{0}} about {{1}}?', "
                f"r.body, t.topic)) WHERE r.id BETWEEN {a} AND {a + rng.randint(0, 4)} ORDER BY 1, 2",
        "classify": f"SELECT r.id, AI_CLASSIFY(r.body, ['good', 'bad', 'neutral']) AS c FROM reviews r "
                    f"WHERE {where} ORDER BY 1",
        "complete": f"SELECT t.id, AI_COMPLETE(PROMPT('Name one word that goes with {{0}}:', t.topic), "
                    f"{{'max_tokens': {rng.randint(1, 6)}{_stops(rng)}}}) AS a FROM topics t WHERE t.id BETWEEN "
                    f"{a % 5} AND {a % 5 + rng.randint(0, 2)} ORDER BY 1",
        "aggregate": f"SELECT r.id % 3 AS g, count(*) AS n, AI_AGG(r.body, 'List the words.', "
                     f"{{'max_tokens': {rng.randint(2, 8)}}}) AS a FROM reviews r WHERE {where} GROUP BY 1 ORDER BY 1",
        "top": f"SELECT r.id, AI_SCORE(PROMPT('{q}', r.body)) AS p FROM reviews r WHERE {where} "
               "ORDER BY p DESC, r.id LIMIT 3",
        "parameters": f"SELECT r.id, AI_SCORE(PROMPT('{q}', r.body)) AS p FROM reviews r WHERE r.id BETWEEN ? AND ? "
                      "ORDER BY 1",
    }[kind]
    return Statement(sql, (a, b) if kind == "parameters" else None,
                     rng.uniform(0.05, 1.0) if rng.random() < CANCELLED_SHARE else None)


def _stops(rng: random.Random) -> str:
    """A generation's stop option half the time: the most stop texts a call may name (16), single letters and
    words, so that some end a sequence."""
    if rng.random() < 0.5:
        return ""
    texts = [*"aeiost", *rng.sample(WORDS, 10)]
    return ", 'stop': [" + ", ".join(f"'{t}'" for t in texts) + "]"


def rows(uri: str, s: Statement) -> list[tuple] | str:
    """The statement's rows on its own connection, or the error it ended in ("status: message")."""
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        timer = threading.Timer(s.cancel_after_s, cur.adbc_cancel) if s.cancel_after_s is not None else None
        if timer is not None:
            timer.start()
        try:
            cur.execute(s.sql, parameters=s.parameters)
            return [tuple(row.values()) for row in cur.fetch_arrow_table().to_pylist()]
        except adbc_driver_manager.Error as err:
            return f"{err.status_code.name}: {err}"
        finally:
            if timer is not None:
                timer.cancel()


def same(got: list[tuple], want: list[tuple]) -> bool:
    """Equal rows, floats to 1e-4 (passes shared with other queries add in another order)."""
    return len(got) == len(want) and all(
        len(x) == len(y) and all(abs(a - b) < 1e-4 if isinstance(a, float) and isinstance(b, float) else a == b
                                 for a, b in zip(x, y)) for x, y in zip(got, want))


@dataclass
class Outcome:
    """What a stress run found: statements sent, answered as alone, cancelled as sent; the findings of each
    kind (module docstring) counted, the first 50 described; the stressed server's KV figures at the end."""

    statements: int = 0
    answered: int = 0
    cancelled: int = 0
    wrong: int = 0
    errors: int = 0
    held: int = 0
    hung: int = 0
    kv: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)

    def note(self, kind: str, detail: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.findings) < 50:
            self.findings.append({"kind": kind, "detail": detail[:2000]})

    def clean(self) -> bool:
        return not (self.wrong or self.errors or self.held or self.hung)


def _load(uri: str, tables: dict[str, pa.Table]) -> None:
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        for name, table in tables.items():
            cur.adbc_ingest(name, table, mode="replace")


def stressed(data: Path, plans: list[list[Statement]], fixed: dict[str, pa.Table], notes: list[pa.Table],
             outcome: Outcome, pool_tokens: int, host_tokens: int) -> dict[tuple[int, int], list[tuple] | str]:
    """Every client's statements at once, and the writer beside them, on a server of a KV pool and host
    tier of these many tokens; what each statement got."""
    got: dict[tuple[int, int], list[tuple] | str] = {}
    port = free_port()
    args = ("--token-budget", "256", "--metrics-port", str(port), "--kv-cache-bytes",
            str(pool_tokens * KV_BYTES_PER_TOKEN), "--kv-host-bytes", str(host_tokens * KV_BYTES_PER_TOKEN))
    with ServerProcess(data, *args) as server:
        _load(server.uri, {**fixed, "notes": notes[0]})
        stop = threading.Event()

        def write() -> None:
            version = 0
            while not stop.wait(0.7):
                version = (version + 1) % len(notes)
                _load(server.uri, {"notes": notes[version]})

        def client(k: int) -> None:
            for j, s in enumerate(plans[k]):
                got[(k, j)] = rows(server.uri, s)

        writer = threading.Thread(target=write)
        clients = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(len(plans))]
        for thread in [writer, *clients]:
            thread.start()
        for thread in clients:
            thread.join(HANG_S)
        stop.set()
        writer.join()
        for k, thread in enumerate(clients):
            if thread.is_alive():
                outcome.note("hung", f"client {k}")
        outcome.kv = _settled(f"http://127.0.0.1:{port}/metrics")
        if outcome.kv["quail_kv_resident_bytes"] or \
                outcome.kv["quail_kv_pool_used_bytes"] != outcome.kv["quail_kv_cached_bytes"]:
            outcome.note("held", json.dumps(outcome.kv))
    return got


def _settled(url: str) -> dict[str, float]:
    """The KV figures once no query runs and no query's KV is held, or after ten seconds."""
    keys = ["quail_kv_pool_bytes", "quail_kv_pool_used_bytes", "quail_kv_resident_bytes", "quail_kv_cached_bytes",
            "quail_kv_host_used_bytes", "quail_kv_evicted_tokens_total", "quail_kv_host_offloaded_tokens_total",
            "quail_kv_host_restored_tokens_total", "quail_queries_running"]
    for _ in range(100):
        values = metric_samples(url, timeout=10)
        if values["quail_queries_running"] == values["quail_kv_resident_bytes"] == 0:
            break
        time.sleep(0.1)
    return {key: values.get(key) for key in keys}


def alone(data: Path, plans: list[list[Statement]], fixed: dict[str, pa.Table],
          notes: list[pa.Table]) -> dict[Statement, list]:
    """Each statement's rows, run alone, uncancelled (one set per version for the rewritten table's)."""
    want: dict[Statement, list] = {}
    distinct = {Statement(s.sql, s.parameters) for plan in plans for s in plan}
    with ServerProcess(data, "--token-budget", "256") as server:
        _load(server.uri, fixed)
        for version in notes:
            _load(server.uri, {"notes": version})
            for s in sorted(distinct, key=lambda s: (s.sql, s.parameters or ())):
                if s.rewritten or s not in want:
                    want.setdefault(s, []).append(rows(server.uri, s))
    return want


def _cancelled(s: Statement, result: list[tuple] | str | None) -> bool:
    """Whether the statement ended as its client's cancel asked (no rows to compare with its rows alone)."""
    return isinstance(result, str) and s.cancel_after_s is not None and result.startswith("CANCELLED")


def run(clients: int, statements: int, seed: int, pool_tokens: int = POOL_TOKENS,
        host_tokens: int = HOST_TOKENS) -> Outcome:
    rng = random.Random(seed)
    fixed, notes = tables(seed)
    plans = [[statement(rng) for _ in range(statements)] for _ in range(clients)]
    outcome = Outcome(statements=clients * statements)
    with tempfile.TemporaryDirectory() as stressed_data, tempfile.TemporaryDirectory() as alone_data:
        got = stressed(Path(stressed_data), plans, fixed, notes, outcome, pool_tokens, host_tokens)
        compared = [[s for j, s in enumerate(plan) if not _cancelled(s, got.get((k, j)))] for k, plan in enumerate(plans)]
        want = alone(Path(alone_data), compared, fixed, notes)
    for (k, j), result in sorted(got.items()):
        s = plans[k][j]
        if _cancelled(s, result):
            outcome.cancelled += 1
            continue
        expected = want[Statement(s.sql, s.parameters)]
        if isinstance(result, str):
            outcome.note("errors", f"{s}: {result}")
        elif any(same(result, rows_alone) for rows_alone in expected if not isinstance(rows_alone, str)):
            outcome.answered += 1
        else:
            outcome.note("wrong", f"{s}: got {result}, alone {expected}")
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--statements", type=int, default=10, help="each client's, one after another")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool-tokens", type=int, default=POOL_TOKENS, help="the stressed server's KV pool")
    parser.add_argument("--host-tokens", type=int, default=HOST_TOKENS, help="and its host tier")
    parser.add_argument("--out", default=None, help="JSON file of the figures and findings")
    args = parser.parse_args(argv)
    started = time.monotonic()
    outcome = run(args.clients, args.statements, args.seed, args.pool_tokens, args.host_tokens)
    result = {"seconds": round(time.monotonic() - started, 1), "date": dt.datetime.now(dt.timezone.utc).isoformat(),
              "command": f"python -m bench.stress --clients {args.clients} --statements {args.statements} "
                         f"--seed {args.seed} --pool-tokens {args.pool_tokens} --host-tokens {args.host_tokens}",
              "seed": args.seed, **vars(outcome)}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "findings"}, indent=1))
    return 0 if outcome.clean() else 1


if __name__ == "__main__":
    raise SystemExit(main())
