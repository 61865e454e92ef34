"""SQL fuzzing against a real server: generated and mutated statements through the ADBC driver.

Statements come from a small grammar over DuckDB SQL and Quail's AI functions
(random projections, joins, conditions, grouping, subqueries, set operations),
and from mutations of those (a token dropped, repeated, swapped or replaced,
the statement cut short). Each goes to a `quail serve --dialect duckdb`
process; what comes back is judged:

- a death: the server process ended (it is restarted and the run goes on);
- an internal error: INTERNAL or UNKNOWN, or a status outside `EXPECTED`;
- a wrong result: a relational statement whose rows differ from DuckDB's own
  on the same tables (compared as multisets, floats to 1e-9 relative);
- a repair: a statement DuckDB refuses as a syntax error but the server ran.

One call in a hundred is one of bench/hostile.py's (huge statements and messages, long stop lists, odd
Arrow types, ...), judged by the statuses it may get.

    python -m bench.fuzz --seconds 1800 --seed 1 --out bench/results/fuzz.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import duckdb
import pyarrow as pa

from bench.hostile import HOSTILE
from quail.clients.server_process import ServerProcess

EXPECTED = {"INVALID_ARGUMENT", "NOT_FOUND", "DEADLINE_EXCEEDED", "TIMEOUT", "RESOURCE_EXHAUSTED",
            "UNIMPLEMENTED", "ALREADY_EXISTS", "CANCELLED"}
_STATUS = re.compile(r"^([A-Z_]+):")


def tables(seed: int = 0) -> dict[str, pa.Table]:
    """The tables every statement runs over: small, with NULLs, duplicates and awkward values."""
    rng = random.Random(seed)
    words = ["apple", "Banana", "cherry", "", "date's", "élan", "fig", None]
    n = 40
    t1 = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "a": pa.array([rng.choice([None, -3, 0, 1, 2, 7, 100]) for _ in range(n)], pa.int32()),
        "b": pa.array([rng.choice([None, -1.5, 0.0, 0.25, 3.0, 1e10]) for _ in range(n)], pa.float64()),
        "s": pa.array([rng.choice(words) for _ in range(n)], pa.string()),
        "d": pa.array([rng.choice([None, dt.date(2020, 1, 1), dt.date(1999, 12, 31)]) for _ in range(n)]),
        "flag": pa.array([rng.choice([None, True, False]) for _ in range(n)]),
    })
    t2 = pa.table({
        "id": pa.array(range(0, 2 * n, 3), pa.int64()),
        "k": pa.array([rng.choice([None, 0, 1, 2]) for _ in range(0, 2 * n, 3)], pa.int64()),
        "txt": pa.array([rng.choice(words) for _ in range(0, 2 * n, 3)], pa.string()),
    })
    docs = pa.table({"id": pa.array(range(6), pa.int64()),
                     "body": ["Great pasta and kind staff.", "The soup was cold.", "A film about cats.",
                              "Late delivery, broken box.", None, "Quiet room, good sleep."],
                     "topic": ["food", "food", "films", "shipping", "food", "travel"]})
    return {"t1": t1, "t2": t2, "docs": docs}


COLUMNS = {"t1": {"id": "int", "a": "int", "b": "num", "s": "str", "d": "date", "flag": "bool"},
           "t2": {"id": "int", "k": "int", "txt": "str"}}
AI_TEMPLATES = ["Is {0} about food?", "Is {0} positive?", "Does {0} mention {1}?"]


class Grammar:
    """Random statements: relational ones DuckDB can check, and AI ones."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, *options):
        return self.rng.choice(options)

    def column(self, scope: dict[str, dict[str, str]], kind: str | None = None) -> str:
        choices = [(alias, c) for alias, cols in scope.items() for c, k in cols.items() if kind in (None, k)]
        if not choices:
            return self.literal(kind or "int")
        alias, c = self.rng.choice(choices)
        return f"{alias}.{c}"

    def literal(self, kind: str) -> str:
        return {"int": lambda: self.pick("0", "1", "-2", "7", "NULL"),
                "num": lambda: self.pick("0.5", "-1.5", "3.0", "1e3", "NULL"),
                "str": lambda: self.pick("'apple'", "''", "'date''s'", "'x'", "NULL"),
                "date": lambda: self.pick("DATE '2020-01-01'", "NULL"),
                "bool": lambda: self.pick("TRUE", "FALSE", "NULL")}[kind]()

    def expr(self, scope, kind: str, depth: int = 0) -> str:
        if depth > 2 or self.rng.random() < 0.35:
            return self.column(scope, kind) if self.rng.random() < 0.7 else self.literal(kind)
        sub = lambda k=kind: self.expr(scope, k, depth + 1)  # noqa: E731
        if kind == "int":
            return self.pick(f"({sub()} + {sub()})", f"({sub()} * {sub()})", f"abs({sub()})",
                             f"coalesce({sub()}, {sub()})", f"length({sub('str')})",
                             f"CASE WHEN {self.cond(scope, depth + 1)} THEN {sub()} ELSE {sub()} END",
                             f"CAST({sub('num')} AS BIGINT)" if self.rng.random() < 0.2
                             else f"greatest({sub()}, {sub()})")
        if kind == "num":
            return self.pick(f"({sub()} - {sub('int')})", f"round({sub()}, 1)", f"({sub()} / 4.0)",
                             f"nullif({sub()}, 0.0)")
        if kind == "str":
            return self.pick(f"upper({sub()})", f"lower({sub()})", f"concat({sub()}, '-')",
                             f"substr({sub()}, 1, 3)", f"coalesce({sub()}, 'none')", f"CAST({sub('int')} AS VARCHAR)")
        if kind == "bool":
            return self.cond(scope, depth + 1)
        return self.column(scope, kind)

    def cond(self, scope, depth: int = 0) -> str:
        kind = self.pick("int", "num", "str", "int")
        left, right = self.expr(scope, kind, depth + 1), self.expr(scope, kind, depth + 1)
        base = self.pick(f"{left} = {right}", f"{left} <> {right}", f"{left} < {right}", f"{left} IS NULL",
                         f"{left} IS NOT NULL", f"{left} IN ({right}, {self.literal(kind)})",
                         f"{left} BETWEEN {right} AND {self.expr(scope, kind, depth + 1)}")
        if depth < 2 and self.rng.random() < 0.3:
            return f"({base} {self.pick('AND', 'OR')} {self.cond(scope, depth + 1)})"
        return f"NOT ({base})" if self.rng.random() < 0.1 else base

    def from_clause(self) -> tuple[str, dict[str, dict[str, str]]]:
        if self.rng.random() < 0.6:
            return "t1 x", {"x": COLUMNS["t1"]}
        join = self.pick("JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN", "JOIN")
        scope = {"x": COLUMNS["t1"], "y": COLUMNS["t2"]}
        on = self.pick("x.id = y.id", "x.a = y.k", f"x.id = y.id AND {self.cond(scope)}")
        return f"t1 x {join} t2 y ON {on}", scope

    def relational(self) -> str:
        """A SELECT DuckDB can answer on its own (result compared as a multiset)."""
        source, scope = self.from_clause()
        where = f" WHERE {self.cond(scope)}" if self.rng.random() < 0.7 else ""
        if self.rng.random() < 0.3:
            key = self.column(scope, self.pick("int", "str"))
            agg = self.pick("count(*)", f"sum({self.column(scope, 'int')})", f"min({self.column(scope, 'str')})",
                            f"max({self.column(scope, 'num')})", f"count(DISTINCT {self.column(scope)})")
            having = f" HAVING count(*) > {self.pick('0', '1')}" if self.rng.random() < 0.3 else ""
            return f"SELECT {key} AS g, {agg} AS v FROM {source}{where} GROUP BY {key}{having}"
        items = ", ".join(f"{self.expr(scope, self.pick('int', 'num', 'str', 'bool'))} AS c{i}"
                          for i in range(self.rng.randint(1, 4)))
        distinct = "DISTINCT " if self.rng.random() < 0.15 else ""
        query = f"SELECT {distinct}{items} FROM {source}{where}"
        roll = self.rng.random()
        if roll < 0.1:
            query += f" UNION{self.pick('', ' ALL')} SELECT {items.split(',')[0].split(' AS ')[0]} AS c0" \
                     f"{''.join(f', NULL AS c{i}' for i in range(1, items.count(' AS ')))} FROM {source}"
        elif roll < 0.2:
            query = f"WITH w AS ({query}) SELECT * FROM w WHERE w.c0 IS NOT NULL"
        elif roll < 0.3:
            query = f"SELECT * FROM ({query}) q WHERE EXISTS (SELECT 1 FROM t2 z WHERE z.k IS NOT NULL)"
        elif roll < 0.4:  # ordered by every column: the rows kept are the same in any engine
            columns = ", ".join(str(k + 1) for k in range(items.count(" AS ")))
            query += f" ORDER BY {columns} LIMIT {self.pick('0', '3', '100')}"
        return query

    def ai(self) -> str:
        """A SELECT with AI functions over the docs table (and t2), from the supported shapes."""
        template = self.pick(*AI_TEMPLATES[:2])
        prompt = f"PROMPT('{template}', d.body)"
        shapes = [
            f"SELECT d.id FROM docs d WHERE AI_FILTER({prompt})",
            f"SELECT d.id, AI_SCORE({prompt}) AS s FROM docs d ORDER BY s DESC LIMIT 2",
            "SELECT d.id, AI_CLASSIFY(d.body, ['food', 'film', 'other']) AS c FROM docs d",
            f"SELECT d.topic, count(*) AS n FROM docs d WHERE AI_FILTER({prompt}) GROUP BY d.topic",
            f"SELECT d.id FROM docs d WHERE d.id < 4 AND AI_FILTER({prompt}, {{'selectivity': 0.5}})",
            "SELECT d.id, z.id FROM docs d JOIN t2 z ON z.id < 4 AND "
            "AI_FILTER(PROMPT('Does {0} mention {1}?', d.body, z.txt))",
            f"SELECT id FROM docs WHERE id IN (SELECT d.id FROM docs d WHERE AI_SCORE({prompt}) > 0.1)",
            f"SELECT d.id FROM docs d LEFT JOIN t2 z ON d.id = z.id AND AI_FILTER({prompt}) LIMIT 5",
            f"EXPLAIN SELECT d.id FROM docs d WHERE AI_FILTER({prompt})",
            f"SELECT count_if(AI_FILTER({prompt})) AS n FROM docs d",
        ]
        return self.rng.choice(shapes)

    def mutate(self, sql: str) -> str:
        """The statement with one random token-level change."""
        tokens = re.findall(r"'(?:[^']|'')*'|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\w+|::|[^\w\s]", sql)
        if not tokens:
            return sql
        i = self.rng.randrange(len(tokens))
        noise = self.pick(",", "(", ")", "AND", "ON", "SELECT", "FROM", "NULL", "'", "*", "1e309",
                          "9223372036854775808", "LATERAL", "::", "[", "}", "--", "/*", ";", "NOT", "BETWEEN")
        action = self.rng.randrange(6)
        if action == 0:
            del tokens[i]
        elif action == 1:
            tokens.insert(i, tokens[i])
        elif action == 2 and i + 1 < len(tokens):
            tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
        elif action == 3:
            tokens[i] = noise
        elif action == 4:
            tokens.insert(i, noise)
        else:
            tokens = tokens[: max(1, i)]
        return " ".join(tokens)


@dataclass
class Outcome:
    """What a fuzz run saw, and the statements worth a look."""

    statements: int = 0
    kinds: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    deaths: int = 0
    internal: int = 0
    wrong: int = 0
    repairs: int = 0
    findings: list[dict[str, str]] = field(default_factory=list)

    def note(self, what: str, sql: str, detail: str) -> None:
        if len(self.findings) < 200:
            self.findings.append({"what": what, "sql": sql, "detail": detail[:500]})

    def as_dict(self) -> dict[str, Any]:
        return {"statements": self.statements, "kinds": dict(self.kinds), "statuses": dict(self.statuses),
                "deaths": self.deaths, "internal": self.internal, "wrong_results": self.wrong,
                "repairs": self.repairs, "findings": self.findings}


def _rows(table: pa.Table) -> Counter:
    """The rows as a multiset, floats to 9 digits, nested values (lists, structs) as their JSON text."""
    def value(v: Any) -> Any:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else float(f"{v:.9g}")
        if isinstance(v, (dict, list)):
            return json.dumps(v, sort_keys=True, default=str)
        return v
    return Counter(tuple(value(v) for v in row.values()) for row in table.to_pylist())


class Fuzzer:
    """Sends statements to a server process, judging each; restarts the server when it dies."""

    def __init__(self, data_dir: Path, seed: int, server_args: tuple[str, ...] = ()) -> None:
        self.rng = random.Random(seed)
        self.grammar = Grammar(self.rng)
        self.tables = tables(seed)
        self.data_dir = data_dir
        self.server_args = ("--dialect", "duckdb", "--query-timeout", "20", *server_args)
        self.reference = duckdb.connect()
        for name, table in self.tables.items():
            self.reference.register(name, table)
        self.outcome = Outcome()
        self.server: ServerProcess | None = None
        self.conn = None

    def start(self) -> None:
        self.server = ServerProcess(self.data_dir, *self.server_args)
        self.server.start()
        self.conn = flight_sql.connect(self.server.uri, autocommit=True)
        with self.conn.cursor() as cur:
            for name, table in {**self.tables, "reviews": self.tables["docs"]}.items():  # reviews: hostile.py's
                cur.adbc_ingest(name, table, mode="replace")

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.server is not None:
            self.server.stop()

    def _server(self, sql: str) -> tuple[str, pa.Table | None, str]:
        """("OK", rows, "") or (status, None, message)."""
        try:
            with self.conn.cursor() as cur:
                cur.execute(sql)
                return "OK", cur.fetch_arrow_table(), ""
        except adbc_driver_manager.Error as err:
            match = _STATUS.match(str(err))
            return (match.group(1) if match else "UNKNOWN"), None, str(err)

    def _duckdb(self, sql: str) -> tuple[str, pa.Table | None]:
        """DuckDB's own answer: ("OK", rows), ("SYNTAX", None) or ("ERROR", None) (also for a statement that
        is no query, which DuckDB answers with no relation)."""
        try:
            relation = self.reference.sql(sql)
            return ("OK", relation.to_arrow_table()) if relation is not None else ("ERROR", None)
        except duckdb.ParserException:
            return "SYNTAX", None
        except duckdb.Error:
            return "ERROR", None

    def one(self, kind: str, sql: str) -> None:
        """Send one statement and judge what came back (relational ones against DuckDB)."""
        self.outcome.statements += 1
        self.outcome.kinds[kind] += 1
        status, rows, message = self._server(sql)
        self.outcome.statuses[status] += 1
        if self.server.process.poll() is not None:
            self.outcome.deaths += 1
            self.outcome.note("death", sql, message)
            self.conn = None
            self.start()
            return
        if status not in EXPECTED | {"OK"}:
            self.outcome.internal += 1
            self.outcome.note("internal", sql, message)
            return
        if kind.endswith("ai"):
            return
        reference, expected = self._duckdb(sql)
        if status == "OK" and reference == "SYNTAX":
            self.outcome.repairs += 1
            self.outcome.note("repair", sql, "DuckDB: syntax error; the server ran it")
        elif status == "OK" and reference == "OK" and _rows(rows) != _rows(expected):
            self.outcome.wrong += 1
            self.outcome.note("wrong", sql, f"server {rows.num_rows} rows, DuckDB {expected.num_rows}")

    def hostile(self, name: str | None = None) -> None:
        """One of bench/hostile.py's calls (`name`; None: one at random), judged by its allowed statuses and
        the server's survival."""
        name = name or self.rng.choice(sorted(HOSTILE))
        call, allowed = HOSTILE[name]
        self.outcome.statements += 1
        self.outcome.kinds["hostile"] += 1
        got = call(self.server.uri, self.rng)
        self.outcome.statuses[got] += 1
        if self.server.process.poll() is not None:
            self.outcome.deaths += 1
            self.outcome.note("death", name, got)
            self.start()
        elif got not in allowed:
            self.outcome.internal += 1
            self.outcome.note("internal", name, f"{got}, not one of {sorted(allowed)}")

    def run(self, seconds: float, ai_share: float = 0.05, mutate_share: float = 0.5,
            hostile_share: float = 0.01, statements: int | None = None) -> Outcome:
        """Statements drawn from the seed for `seconds`, or until `statements` have gone (the same ones on any
        machine, however fast)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and (statements is None or self.outcome.statements < statements):
            if self.rng.random() < hostile_share:
                self.hostile()
                continue
            kind = "ai" if self.rng.random() < ai_share else "relational"
            sql = self.grammar.ai() if kind == "ai" else self.grammar.relational()
            if self.rng.random() < mutate_share:
                sql = self.grammar.mutate(sql)
                kind = f"mutated-{kind}"
            self.one(kind, sql)
        return self.outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON file of the figures and findings")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as data:
        fuzzer = Fuzzer(Path(data), args.seed)
        fuzzer.start()
        try:
            started = time.monotonic()
            outcome = fuzzer.run(args.seconds)
            elapsed = time.monotonic() - started
        finally:
            fuzzer.stop()
    result = {"seconds": round(elapsed, 1), "seed": args.seed, "date": dt.datetime.now(dt.timezone.utc).isoformat(),
              "command": f"python -m bench.fuzz --seconds {args.seconds:g} --seed {args.seed}", **outcome.as_dict()}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "findings"}, indent=1))
    return 0 if not (outcome.deaths or outcome.internal or outcome.wrong or outcome.repairs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
