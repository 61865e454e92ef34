"""Start and stop a `quail serve` child process, as the demo and the tests do; pick its ports; read its metrics."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable
from urllib.request import urlopen

READY_PREFIX = "quail: serving "


def free_port() -> int:
    """A loopback TCP port free now (for a server's --metrics-port, or another listener)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def metric_samples(url: str, timeout: float = 30.0) -> dict[str, float]:
    """The samples of a Prometheus /metrics page, by name with labels (`quail_queries_total{status="OK"}`)."""
    with urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    return {key: float(value) for key, _, value in
            (line.rpartition(" ") for line in text.splitlines() if line and not line.startswith("#"))}


class ServerProcess:
    """A server on a free loopback port over a data directory; a context manager. `module`: what runs
    `serve` (`python -m module serve ...`; a probe that wraps the CLI); `log`: a file its log (stderr) is
    appended to, else this process's stderr. `launch` starts the child (`subprocess.Popen`; a test run
    forks its servers from a process that has imported the server's modules already: tests/fork_server.py)."""

    launch: Callable[..., subprocess.Popen] = subprocess.Popen

    def __init__(self, data_dir: str | Path, *extra_args: str, startup_timeout: float = 180.0,
                 module: str = "quail.cli", log: Path | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.log = log
        self.args = [sys.executable, "-m", module, "serve", "--port", "0", "--data-dir", str(self.data_dir),
                     *extra_args]
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self.uri = ""

    def start(self) -> str:
        """Launch and wait for the ready line; returns the grpc:// URI."""
        with open(self.log, "a") if self.log is not None else contextlib.nullcontext() as log:
            self.process = self.launch(self.args, stdout=subprocess.PIPE, stderr=log, text=True,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready = threading.Event()

        def read_ready_line() -> None:
            for line in self.process.stdout:
                if line.startswith(READY_PREFIX):
                    self.uri = line[len(READY_PREFIX):].strip()
                    break
            ready.set()  # ready, or its output ended: it exited

        threading.Thread(target=read_ready_line, daemon=True).start()
        if not ready.wait(self.startup_timeout) or not self.uri:
            self.stop()
            raise RuntimeError(f"quail serve did not become ready: {' '.join(self.args)}")
        return self.uri

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait, and return the exit code (killing it if it hangs)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
