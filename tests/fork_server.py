"""Server processes forked from one that has imported the server's modules already (a test run's launcher).

A `quail serve` spends about 2.5 of its 3 s of start-up importing torch, gRPC,
DuckDB and the planner; a test run starts about ninety of them. Here one
process per test worker (`ForkServer`) imports them once, and each server is a
fork of it that then runs `python -m <module> <args>` as a fresh interpreter
would, from its own working directory, environment, stdout and stderr: the same
command, the same code, its own process. `Forked` stands for it as
`subprocess.Popen` does (`ServerProcess.launch`).

- The fork server is single-threaded (nothing runs beside a fork): it waits on
  its socket and on a pipe its SIGCHLD handler writes to, forks a child for
  each request (argv, environment and working directory, the child's stdout and
  stderr passed as descriptors), and reports each child's pid, then its exit
  status.
- A child returns to the top of the fork server's loop and leaves it by
  `SystemExit` with the module's code, so the interpreter exits as any other:
  its threads joined, its exit handlers run.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

# What `quail serve` imports (torch, Arrow Flight, DuckDB, the planner), short of the modules that start
# threads as they load (the server's metadata asks DuckDB for its keywords): a child forked beside a thread
# it does not have aborts at its exit.
PRELOAD = ("torch", "pyarrow.flight", "quail.engine.runtime.loading", "quail.engine.exec.database",
           "quail.server.query_service")
MESSAGE_BYTES = 1 << 20
FORK_TIMEOUT_S = 120.0  # for the fork server's first reply (its imports, then a fork)


def _serve(control: socket.socket) -> int:
    """The fork server's loop; in a child, the exit code of the module it ran."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([control, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
            _reap(control)
        if control not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES, 2)
        if not message:
            return 0
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (control.fileno(), wake_read, wake_write):
                os.close(fd)
            return _child(json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        control.send(json.dumps({"pid": pid}).encode())


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """Run `python -m module args` in this forked child, with the request's stdout, stderr, environment
    and working directory."""
    for fd, target in zip(fds, (1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    module, args = request["module"], request["args"]
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


class ForkServer:
    """A fork server started on first use, for this process's servers; `popen` starts one."""

    def __init__(self) -> None:
        self._control: socket.socket | None = None
        self._replied = threading.Condition()  # a reply came: a child's pid, or a child's exit code
        self._started: list[int] = []
        self._exited: dict[int, int] = {}

    def _start(self) -> socket.socket:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message a packet
        subprocess.Popen([sys.executable, "-m", "tests.fork_server", str(theirs.fileno())], pass_fds=[theirs.fileno()],
                         stdin=subprocess.DEVNULL, cwd=Path(__file__).parent.parent)
        theirs.close()
        threading.Thread(target=self._read, args=(mine,), name="fork-server-replies", daemon=True).start()
        return mine

    def _read(self, control: socket.socket) -> None:
        while reply := control.recv(MESSAGE_BYTES):
            reply = json.loads(reply)
            with self._replied:
                if "pid" in reply:
                    self._started.append(reply["pid"])
                else:
                    self._exited[reply["exited"]] = reply["code"]
                self._replied.notify_all()

    def popen(self, args: list[str], stdout: int, stderr: IO | None, text: bool, env: dict[str, str]) -> "Forked":
        """`subprocess.Popen(args, stdout=PIPE, ...)` for `[python, -m, module, ...]`, forked."""
        assert args[0] == sys.executable and args[1] == "-m" and stdout == subprocess.PIPE and text
        read_end, write_end = os.pipe()
        err = stderr.fileno() if stderr is not None else 2  # as a child inherits it
        request = {"module": args[2], "args": args[3:], "env": env, "cwd": os.getcwd()}
        with self._replied:
            if self._control is None:
                self._control = self._start()
            socket.send_fds(self._control, [json.dumps(request).encode()], [write_end, err])
            os.close(write_end)
            if not self._replied.wait_for(lambda: self._started, FORK_TIMEOUT_S):
                raise RuntimeError(f"the fork server did not start {args[2]} within {FORK_TIMEOUT_S} s")
            pid = self._started.pop(0)
        return Forked(self, pid, open(read_end, "r"))

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._replied:
            self._replied.wait_for(lambda: pid in self._exited, timeout)
            return self._exited.get(pid)


class Forked:
    """A forked server, as `subprocess.Popen` stands for a child: its pid, stdout, signals and exit code."""

    def __init__(self, forks: ForkServer, pid: int, stdout: IO[str]) -> None:
        self.forks, self.pid, self.stdout = forks, pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            self.returncode = self.forks.exit_code(self.pid, timeout)
            if self.returncode is None and timeout:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    for name in PRELOAD:
        __import__(name)
    raise SystemExit(_serve(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=int(sys.argv[1]))))
