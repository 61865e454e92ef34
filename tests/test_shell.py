"""`quail sql` on a real server: the shell driven as a person would (a pseudo-terminal: statements, one over
several lines, commands, an error, Ctrl-C cancelling a long AI query), and -c / -f scripts with their exit
statuses and formats."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time

import pexpect
import pyarrow as pa
import pytest

import quail
from quail.shell_statements import statements

PROMPT = "quail> "
MORE = "  ...> "
PETS = pa.table({"id": [1, 2, 3], "name": ["cat", "dog", "owl"]})
NOTES = pa.table({"id": list(range(3000)),
                  "body": [f"Note {i}: the {'cat' if i % 2 else 'dog'} slept on mat {i} all afternoon."
                           for i in range(3000)]})
LONG = "SELECT count(*) AS cats FROM notes WHERE AI_FILTER(PROMPT('Is {0} about cats?', body))"  # minutes on a CPU


@pytest.fixture(scope="module")
def uri(server):
    with quail.connect(server.uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("pets", PETS, mode="replace")
        cur.adbc_ingest("notes", NOTES, mode="replace")
    return server.uri


def quail_sql(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quail.cli", "sql", *args], capture_output=True, text=True,
                          input=stdin, timeout=60)


def listed(uri: str, query: str) -> bool:
    with quail.connect(uri) as conn, conn.cursor() as cur:
        cur.execute("SELECT query FROM quail_queries")
        return query in cur.fetch_arrow_table().column("query").to_pylist()


def until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.2)
    return True


@pytest.fixture
def shell(uri, tmp_path):
    child = pexpect.spawn(sys.executable, ["-m", "quail.cli", "sql", uri], encoding="utf-8", timeout=30,
                          env={**os.environ, "QUAIL_HISTORY": str(tmp_path / "history"),
                               "TERM": "dumb"})
    child.expect("connected to")
    child.expect_exact(PROMPT)
    yield child
    child.close(force=True)


def test_statements_end_at_semicolons_outside_quotes_and_comments():
    assert statements("SELECT ';' AS a; -- x;\nSELECT \"b;\" /* ; */ FROM t;\nSELECT") == (
        ["SELECT ';' AS a", "-- x;\nSELECT \"b;\" /* ; */ FROM t"], "\nSELECT")
    assert statements("-- only a comment\n") == ([], "")
    assert statements("SELECT 'open;") == ([], "SELECT 'open;")


def test_a_person_at_the_shell(shell, tmp_path):
    shell.sendline("SELECT id, name FROM pets ORDER BY id;")
    shell.expect(r"id\s+\|\s+name\s*\r\n\s*int64\s+\|\s+string")
    shell.expect_exact("owl")
    shell.expect(r"\(3 rows, \d+\.\d+ s\)")
    shell.expect_exact(PROMPT)
    shell.sendline("SELECT name")  # a statement over three lines
    shell.expect_exact(MORE)
    shell.sendline("FROM pets")
    shell.expect_exact(MORE)
    shell.sendline("WHERE id = 2;")
    shell.expect_exact("dog")
    shell.expect_exact("(1 row, ")
    shell.expect_exact(PROMPT)
    shell.sendline(".tables")
    shell.expect(r"main\s+\|\s+notes")
    shell.expect(r"main\s+\|\s+pets")
    shell.expect_exact(PROMPT)
    shell.sendline(".schema pets")
    shell.expect(r"pets\s+\|\s+name\s+\|\s+string")
    shell.expect_exact(PROMPT)
    shell.sendline("SELECT * FROM no_such_table;")
    shell.expect_exact("Error: ")
    shell.expect_exact(PROMPT)
    shell.sendline("SELECT 40 + 2 AS answer;")  # the error left the shell running
    shell.expect_exact("42")
    shell.expect_exact(PROMPT)
    shell.sendline("SELECT")  # Ctrl-C drops the statement being typed
    shell.expect_exact(MORE)
    shell.sendintr()
    shell.expect_exact(PROMPT)
    shell.sendline("SELECT 6 * 7 AS again;")
    shell.expect_exact("42")
    shell.expect_exact(PROMPT)
    shell.sendeof()
    shell.expect(pexpect.EOF)
    shell.wait()
    assert shell.exitstatus == 0
    history = (tmp_path / "history").read_text().splitlines()
    assert "SELECT name FROM pets WHERE id = 2;" in history, "a statement of several lines: one entry"


def test_ctrl_c_cancels_a_long_ai_query_on_the_server(shell, uri):
    shell.sendline(LONG + ";")
    assert until(lambda: listed(uri, LONG), 30), "the query runs"
    shell.expect(r"[\d,]+ requests, [\d,]+ / [\d,]+ tokens")  # the progress line, from quail_queries
    shell.sendintr()
    shell.expect_exact("query cancelled")
    shell.expect_exact(PROMPT)
    assert until(lambda: not listed(uri, LONG), 30), "the server stopped it"
    shell.sendline("SELECT count(*) AS pets FROM pets;")
    shell.expect(r"\s3\r\n\(1 row, ")
    shell.expect_exact(PROMPT)


def test_ctrl_c_at_any_moment_of_a_statement_leaves_the_shell_whole(shell):
    """Ctrl-C early and late in statements, over and over: each ends cancelled or answered, and the shell goes
    on (the caller's thread makes no driver call meanwhile, and never takes a thread as ended before it is)."""
    rng = random.Random(7)
    for _ in range(12):
        shell.sendline(LONG + ";")
        time.sleep(rng.uniform(0.0, 0.8))
        shell.sendintr()
        assert shell.expect_exact(["query cancelled", "(1 row, "]) in (0, 1)
        shell.expect_exact(PROMPT)
    shell.sendline("SELECT count(*) AS pets FROM pets;")
    shell.expect(r"\s3\r\n\(1 row, ")
    shell.expect_exact(PROMPT)
    assert shell.isalive()


def test_c_runs_statements_and_exits_0(uri):
    done = quail_sql(uri, "-c", "SELECT id, name FROM pets ORDER BY id; SELECT count(*) AS n FROM pets")
    assert done.returncode == 0, done.stderr
    assert "(3 rows, " in done.stdout and "(1 row, " in done.stdout and "owl" in done.stdout


def test_errors_are_one_line_and_a_non_zero_status(uri, tmp_path):
    failed = quail_sql(uri, "-c", "SELECT * FROM no_such_table")
    assert failed.returncode == 1
    assert failed.stderr.startswith("quail: error: ") and "no_such_table" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1 and "Traceback" not in failed.stderr
    script = tmp_path / "broken.sql"
    script.write_text("SELECT 'before' AS step;\nSELECT * FROM\n  no_such_table;\nSELECT 'after' AS step;\n")
    stopped = quail_sql(uri, "-f", str(script))
    assert stopped.returncode == 1 and "before" in stopped.stdout and "after" not in stopped.stdout
    unreachable = quail_sql("grpc://127.0.0.1:1", "-c", "SELECT 1")
    assert unreachable.returncode == 2 and "cannot connect" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr


def test_f_runs_a_file_of_statements_and_commands(uri, tmp_path):
    script = tmp_path / "ok.sql"
    script.write_text("-- pets by name\nSELECT name\n  FROM pets\n  WHERE id > 1\n  ORDER BY name;\n"
                      ".tables\nSELECT 'a;b' AS text  -- no ; at the end\n")
    done = quail_sql(uri, "-f", str(script))
    assert done.returncode == 0, done.stderr
    assert "(2 rows, " in done.stdout and "pets" in done.stdout and "a;b" in done.stdout


def test_csv_and_json_formats_for_scripts(uri):
    query = "SELECT id, name FROM pets ORDER BY id"
    as_csv = quail_sql(uri, "--format", "csv", "-c", query)
    assert as_csv.returncode == 0 and as_csv.stdout.splitlines() == ['"id","name"', '1,"cat"', '2,"dog"', '3,"owl"']
    as_json = quail_sql(uri, "--format", "json", stdin=query + ";\n")  # statements piped in: a script too
    assert as_json.returncode == 0, as_json.stderr
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == PETS.to_pylist()
