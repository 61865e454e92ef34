"""`quail sql`: a SQL shell on a Quail server over ADBC, or the statements of `-c` / `-f` run to an exit status.

- Statements may span lines, ended by `;`; shell commands start with `.` (`.help`); shell_statements runs them.
- Ctrl-C cancels a running statement on the server and comes back to the prompt; at the prompt it clears the
  statement being typed; Ctrl-D leaves.
- History: readline's, kept in $QUAIL_HISTORY (default ~/.quail_history); a statement of several lines is
  kept as one entry.
- Scripts (-c, -f, or statements piped in) stop at the first error, its line on stderr: exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from quail.remote import connect, error_reason, tls_options
from quail.shell_statements import FAILURES, Shell

HISTORY_LINES = 1000


def _history() -> tuple[Any, Path | None]:
    """readline with the history file read in (None, None where there is no readline)."""
    try:
        import readline
    except ImportError:
        return None, None
    path = Path(os.environ.get("QUAIL_HISTORY") or Path.home() / ".quail_history")
    readline.set_history_length(HISTORY_LINES)
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    return readline, path


def _as_one_entry(readline, first: int) -> None:
    """The history's lines from entry `first` (counted from 0) on, one statement's, as a single entry."""
    count = readline.get_current_history_length()
    lines = [readline.get_history_item(k + 1) for k in range(first, count)]
    for k in reversed(range(first, count)):
        readline.remove_history_item(k)
    readline.add_history(" ".join(lines))


def _interact(shell: Shell, uri: str) -> int:
    readline, path = _history()
    print(f"quail sql: connected to {uri}. Statements end with ';'; .help for help.")
    first = 0
    try:
        while not shell.quit:
            if readline is not None and not shell.buffer:
                first = readline.get_current_history_length()
            try:
                line = input(shell.prompt())
            except KeyboardInterrupt:  # like psql: the statement being typed is dropped
                print()
                shell.buffer = ""
                continue
            except EOFError:
                print()
                break
            pending = bool(shell.buffer)
            with contextlib.suppress(KeyboardInterrupt):  # outside a statement: back to the prompt
                shell.feed(line)
            if readline is not None and pending and not shell.buffer:
                _as_one_entry(readline, first)
    finally:
        if readline is not None:
            with contextlib.suppress(OSError):
                readline.write_history_file(path)
    return 0


def _run_script(shell: Shell, text: str) -> int:
    for line in text.splitlines():
        if not shell.feed(line):
            return 1
        if shell.quit:
            return 0
    return 0 if shell.finish() else 1


def _script(args: argparse.Namespace) -> str | None:
    """The statements to run and exit (-c, -f, or stdin when it is not a terminal); None: the shell."""
    if args.command is not None:
        return args.command
    if args.file == "-" or (args.file is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    return Path(args.file).read_text() if args.file else None


def run(args: argparse.Namespace, login: dict[str, str]) -> int:
    """`quail sql`: the shell, or a script's statements; the exit status (2: the server cannot be reached)."""
    script = _script(args)
    if args.format == "arrow" and sys.stdout.isatty():
        raise ValueError("--format arrow writes binary: send stdout to a file or a pipe")
    options = {**login, **tls_options(args.tls_root_certs, args.tls_skip_verify, args.tls_override_hostname)}
    try:
        connection = connect(args.uri, args.dialect, **options)
        connection.adbc_get_info()  # reach the server (and log in) now, not at the first statement
    except FAILURES as err:
        print(f"quail: error: cannot connect to {args.uri}: {error_reason(err)}", file=sys.stderr)
        return 2
    shell = Shell(connection, lambda: connect(args.uri, args.dialect, **options), args.format, args.max_rows,
                  script=script is not None)
    try:
        return _interact(shell, args.uri) if script is None else _run_script(shell, script)
    except KeyboardInterrupt:
        return 130
    finally:
        shell.close()
