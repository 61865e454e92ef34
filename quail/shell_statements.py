"""Running `quail sql`'s statements and shell commands: the Shell, and how input splits into statements.

- Statements end with `;` outside quotes and comments; a line starting with `.` (or `\\q`) where a statement
  would start is a shell command (HELP).
- Each statement runs in a worker thread while the caller's waits: Ctrl-C there cancels it on the server
  (`adbc_cancel`): Cancelled.
- While a statement runs, a terminal's stderr shows its progress: its row of the server's `quail_queries`
  (the one with its text), read over a second connection by a thread of its own.
- The caller's thread makes no ADBC call while a Ctrl-C may come, and learns that a thread has ended from an
  Event it sets, never from `Thread.join` / `is_alive`:
  - the driver manager answers a SIGINT during a call on the main thread by cancelling that call from a
    thread of its own, which may run after the call's statement is gone (a crash); the Ctrl-C is not seen;
  - a KeyboardInterrupt inside `Thread.join` (Python before 3.13) marks the thread ended while it runs, and
    closing its cursor then frees what it still reads.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Callable

import pyarrow as pa
from adbc_driver_manager import Error as DriverError

from quail import shell_output as output
from quail.remote import error_reason, listed_tables

HELP = """Statements end with ';' and may span lines. Ctrl-C cancels a running statement (at the prompt: clears
the statement); Ctrl-D leaves.
  .help             this text
  .tables           the tables and views
  .schema [TABLE]   the columns of TABLE (of every table without one), their Arrow and SQL types
  .explain SQL      the server's plan of SQL (it runs EXPLAIN SQL), a line per step
  .maxrows N        rows a table shows at most (0: all)
  .quit, .exit, \\q  leave"""
CLOSERS = {"'": "'", '"': '"', "--": "\n", "/*": "*/"}  # what ends each quote and comment
COMMENTS = ("--", "/*")
WATCH = "SELECT * FROM quail_queries"
PROGRESS_AFTER_S = 0.5  # a statement's progress shows once it has run this long, read every POLL_S
POLL_S = 0.5
CANCEL_WAIT_S = 30.0  # how long a cancelled statement may take to end before the shell leaves it


class Refused(Exception):
    """A shell command that cannot run as given."""


class Cancelled(Exception):
    """The running statement was cancelled (Ctrl-C)."""


FAILURES = (DriverError, pa.ArrowException, ConnectionError, Refused)


def statements(text: str) -> tuple[list[str], str]:
    """The statements `text` completes, each ended by a `;` outside quotes and comments (without it), and the
    text after the last: "" when that is blank or only comments."""
    done: list[str] = []
    start, k, code = 0, 0, False
    while k < len(text):
        opener = next((o for o in CLOSERS if text.startswith(o, k)), None)
        if opener is not None:
            end = text.find(CLOSERS[opener], k + len(opener))
            code = code or opener not in COMMENTS
            if end < 0:
                return done, text[start:]
            k = end + len(CLOSERS[opener])
        elif text[k] == ";":
            if code:
                done.append(text[start:k].strip())
            start, k, code = k + 1, k + 1, False
        else:
            code = code or not text[k].isspace()
            k += 1
    return done, text[start:] if code else ""


def tables(connection) -> pa.Table:
    """The tables and views the server lists: their schema, name and type."""
    return pa.Table.from_pylist(listed_tables(connection), pa.schema([("schema", pa.string()), ("name", pa.string()),
                                                 ("type", pa.string())]))


def columns(connection, table: str | None = None) -> pa.Table:
    """The columns of `table` (`schema.table` or `table`; every listed table's when None): Arrow and SQL types."""
    listed = tables(connection).to_pylist() if table is None else [
        dict(zip(("schema", "name"), table.rpartition(".")[::2]))]
    rows = []
    for entry in listed:
        schema = connection.adbc_get_table_schema(entry["name"], db_schema_filter=entry["schema"] or None)
        rows += [{"table": entry["name"], "column": field.name, "type": str(field.type),
                  "sql_type": (field.metadata or {}).get(b"ARROW:FLIGHT:SQL:TYPE_NAME", b"").decode(),
                  "nullable": field.nullable} for field in schema]
    return pa.Table.from_pylist(rows, pa.schema([("table", pa.string()), ("column", pa.string()),
                                                 ("type", pa.string()), ("sql_type", pa.string()),
                                                 ("nullable", pa.bool_())]))


class Shell:
    """Runs statements and shell commands on an ADBC connection, printing what they give.

    watcher: opens the second connection that reads `quail_queries` (when a statement's progress first shows).
    script: stop at the first error, and say it as `quail: error: ...`."""

    def __init__(self, connection, watcher: Callable[[], Any], fmt: str = "table", max_rows: int = 40,
                 script: bool = False) -> None:
        self.connection, self.open_watcher, self.watcher = connection, watcher, None
        self.fmt, self.max_rows, self.script = fmt, max_rows, script
        self.buffer = ""
        self.quit = False
        self.progress = sys.stderr.isatty()
        self.drawn = False

    def prompt(self) -> str:
        return "  ...> " if self.buffer else "quail> "

    def feed(self, line: str) -> bool:
        """Run what the line completes: a shell command, or the statements it ends. False on a script's error."""
        if not self.buffer and line.lstrip().startswith((".", "\\")):
            return self.attempt(self.command, line.strip())
        done, self.buffer = statements(self.buffer + line + "\n")
        for sql in done:
            if not self.attempt(self.query, sql) and self.script:
                return False
        return True

    def finish(self) -> bool:
        """Run a last statement left without its `;` (at a script's end); False on an error."""
        done, rest = statements(self.buffer + "\n;")
        self.buffer = ""
        if rest:
            self.fail("the input ends inside a quote or a comment")
            return False
        return all(self.attempt(self.query, sql) for sql in done)

    def attempt(self, action: Callable[[str], None], text: str) -> bool:
        try:
            action(text)
            return True
        except Cancelled as cancelled:
            print(f"query cancelled ({cancelled})", file=sys.stderr)
        except FAILURES as err:
            self.fail(error_reason(err))
        return False

    def fail(self, reason: str) -> None:
        print(f"{'quail: error' if self.script else 'Error'}: {reason}", file=sys.stderr)

    def query(self, sql: str) -> None:
        if self.fmt != "table":
            sys.stdout.flush()
            self.run(sql, lambda reader: output.WRITERS[self.fmt](reader, sys.stdout.buffer))
            sys.stdout.buffer.flush()
            return
        (table, total), seconds = self.run(sql, lambda reader: output.collect(reader, self.max_rows))
        rows = output.changed(table)
        print(output.render(table, total, seconds) if rows is None else output.render_changed(rows, seconds))

    def command(self, line: str) -> None:
        name, _, rest = line.partition(" ")
        rest = rest.strip().rstrip(";").strip()
        if name in (".quit", ".exit", "\\q"):
            self.quit = True
        elif name == ".help":
            print(HELP)
        elif name == ".tables":
            print(output.render(_Work(lambda: tables(self.connection)).outcome()))
        elif name == ".schema":
            print(output.render(_Work(lambda: columns(self.connection, rest or None)).outcome()))
        elif name == ".explain" and rest:
            (plan, _), _ = self.run("EXPLAIN " + rest, lambda reader: output.collect(reader, 0))
            print("\n".join(map(str, plan.column(0).to_pylist())))
        elif name == ".maxrows" and rest.isdigit():
            self.max_rows = int(rest)
        else:
            raise Refused(f"cannot run {line!r}: .help lists the commands")

    def run(self, sql: str, consume: Callable[[pa.RecordBatchReader], Any]) -> tuple[Any, float]:
        """Run a statement and `consume` its result in a worker thread: what that gives, and the seconds it
        all took. Ctrl-C meanwhile cancels the statement on the server: Cancelled."""
        cursor = self.connection.cursor()
        started = time.monotonic()

        def execute() -> Any:
            cursor.execute(sql)
            return consume(cursor.fetch_record_batch())

        work = _Work(execute)
        watch = _Watch(self, sql) if self.progress else None
        try:
            self.wait(work, watch, started)
        except KeyboardInterrupt:
            cursor.adbc_cancel()
            work.ended.wait(CANCEL_WAIT_S)
            raise Cancelled(f"after {time.monotonic() - started:.1f} s") from None
        finally:
            self.draw("")
            if watch is not None:
                watch.done.set()
                if not watch.ended.wait(CANCEL_WAIT_S):
                    self.watcher = None  # still reading: the next statement's progress opens a connection of its own
            if work.ended.is_set():
                cursor.close()
        return work.result(), time.monotonic() - started

    def wait(self, work: "_Work", watch: "_Watch | None", started: float) -> None:
        """Wait for the work, drawing the statement's progress (read by `watch`) once it has run a while."""
        while not work.ended.wait(0.1):
            elapsed = time.monotonic() - started
            if watch is not None and self.progress and elapsed > PROGRESS_AFTER_S:
                self.draw(output.progress_line(watch.row, elapsed))

    def listed(self, sql: str) -> dict | None:
        """The statement's latest row of `quail_queries`, by its text (None: not listed; no progress is shown
        after the watcher fails)."""
        try:
            if self.watcher is None:
                self.watcher = self.open_watcher()
            with self.watcher.cursor() as cursor:
                cursor.execute(WATCH)
                rows = [row for row in cursor.fetch_arrow_table().to_pylist() if row["query"] == sql]
        except FAILURES:
            self.progress = False
            return None
        return rows[-1] if rows else None

    def draw(self, line: str) -> None:
        """Replace the progress line on stderr (clear it: "")."""
        if self.drawn or line:
            sys.stderr.write("\r\x1b[K" + line)
            sys.stderr.flush()
            self.drawn = bool(line)

    def close(self) -> None:
        for connection in (self.watcher, self.connection):
            if connection is not None:
                with contextlib.suppress(RuntimeError):  # a statement still ending, left after a cancel
                    connection.close()


class _Work:
    """A call run on a thread of its own: `ended` is set once it has returned or raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.ended = threading.Event()
        self._outcome: list = []

        def run() -> None:
            try:
                self._outcome.append(call())
            except Exception as err:  # handed to the waiting thread, which raises it
                self._outcome.append(err)
            finally:
                self.ended.set()

        threading.Thread(target=run, daemon=True).start()

    def result(self) -> Any:
        """What the call returned; what it raised, raised again (once it has ended)."""
        if isinstance(self._outcome[0], Exception):
            raise self._outcome[0]
        return self._outcome[0]

    def outcome(self) -> Any:
        """`result()` once the call has ended: a Ctrl-C meanwhile waits for that too (a metadata call cannot
        be cancelled), then goes on as KeyboardInterrupt."""
        try:
            self.ended.wait()
        except KeyboardInterrupt:
            self.ended.wait(CANCEL_WAIT_S)
            raise
        return self.result()


class _Watch:
    """A statement's progress: its row of `quail_queries` (`row`), read every POLL_S after PROGRESS_AFTER_S
    until `done` is set, on a thread of its own; `ended` is set once that thread has stopped."""

    def __init__(self, shell: Shell, sql: str) -> None:
        self.row: dict | None = None
        self.done, self.ended = threading.Event(), threading.Event()

        def poll() -> None:
            try:
                wait = PROGRESS_AFTER_S
                while shell.progress and not self.done.wait(wait):
                    self.row, wait = shell.listed(sql), POLL_S
            finally:
                self.ended.set()

        threading.Thread(target=poll, daemon=True).start()
