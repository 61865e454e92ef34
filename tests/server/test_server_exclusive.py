"""A server owns its port and its data directory, and never touches files it did not write."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pytest

from quail.clients.server_process import ServerProcess
from quail.engine.exec.database import FILE


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _launch(*args: str, log: Path) -> subprocess.Popen:
    """`quail serve` with these arguments, launched as `ServerProcess` launches one (in a test run, forked), its
    output piped and its log appended to `log`."""
    with open(log, "a") as err:
        return ServerProcess.launch([sys.executable, "-m", "quail.cli", "serve", *args], stdout=subprocess.PIPE,
                                    stderr=err, text=True, env=dict(os.environ))


def _serve(*args: str, log: Path) -> subprocess.CompletedProcess:
    """A `quail serve` expected to refuse to start: its exit code, its output, and its log."""
    child = _launch(*args, log=log)
    out = child.stdout.read()
    return subprocess.CompletedProcess(args, child.wait(300), out, log.read_text())


def test_a_users_files_in_the_data_directory_survive_a_server(tmp_path):
    (tmp_path / "thesis.txt").write_text("four years of work")
    with ServerProcess(tmp_path) as server, flight_sql.connect(server.uri, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.adbc_ingest("t", pa.table({"a": [1, 2]}), mode="create")
    with ServerProcess(tmp_path) as server, flight_sql.connect(server.uri, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT sum(a) AS s FROM t")
            assert cur.fetchall() == [(3,)]
    assert (tmp_path / "thesis.txt").read_text() == "four years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["thesis.txt", FILE])


def test_a_busy_port_and_a_held_data_directory_are_refused_in_one_line(tmp_path):
    with ServerProcess(tmp_path / "first") as first, flight_sql.connect(first.uri, autocommit=True) as conn:
        port = first.uri.rsplit(":", 1)[1]
        same_port = _serve("--port", port, "--data-dir", str(tmp_path / "second"), log=tmp_path / "port.log")
        assert same_port.returncode == 2 and "serving" not in same_port.stdout
        assert same_port.stderr.strip() == f"quail: error: cannot listen on 127.0.0.1:{port}: the port is in use"
        same_dir = _serve("--port", "0", "--data-dir", str(tmp_path / "first"), log=tmp_path / "dir.log")
        assert same_dir.returncode == 2 and "serving" not in same_dir.stdout
        assert same_dir.stderr.strip().startswith("quail: error: the data directory")
        assert "in use by another Quail server" in same_dir.stderr and "\n" not in same_dir.stderr.strip()
        with conn.cursor() as cur:  # the first server still answers every connection
            cur.execute("SELECT 1 AS x")
            assert cur.fetchall() == [(1,)]


def test_a_server_restarts_on_its_own_port_at_once(tmp_path):
    """The stopped server closed a client's connection first (its end waits out FIN-WAIT / TIME-WAIT on the
    port): that port is free for the next server, not busy for a minute."""
    with ServerProcess(tmp_path) as first, flight_sql.connect(first.uri, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE t AS SELECT 7 AS a")
        port = first.uri.rsplit(":", 1)[1]
        idle = socket.create_connection(("127.0.0.1", int(port)))  # a client that does not close its end
        assert first.stop() == 0
    with idle, ServerProcess(tmp_path, "--port", port) as second, \
            flight_sql.connect(second.uri, autocommit=True) as conn:
        assert second.uri.endswith(f":{port}")
        with conn.cursor() as cur:
            cur.execute("SELECT a FROM t")
            assert cur.fetchall() == [(7,)]


@pytest.mark.parametrize("args, message", [
    pytest.param(("--device", "cuda"), "no CUDA GPU is available",
                 marks=pytest.mark.skipif(_has_cuda(), reason="this machine has a CUDA GPU")),
    (("--device", "gpu"), "unknown device 'gpu'"),
    (("--port", "99999"), "port 99999 is not a TCP port"), (("--token-budget", "0"), "token budget must be at least"),
    (("--max-active", "0"), "--max-active must be at least 1"), (("--users", "/no/such/file"), "No such file"),
    (("--dialect", "postgres"), "unknown dialect"),
    (("--kv-cache-bytes", str(10 ** 15)), "does not fit in the memory of cpu: lower --kv-cache-bytes"),
    (("--kv-host-bytes", str(10 ** 15)), "does not fit in this machine's memory: lower --kv-host-bytes"),
    (("--kv-host-bytes", "-1"), "the host KV tier's bytes cannot be negative"),
    (("--kv-disk-dir", "/no/such/dir"), "--kv-disk-dir /no/such/dir is not a directory"),
    (("--kv-disk-bytes", "0"), "the disk KV tier's bytes must be positive"),
    (("--kv-disk-dir", "/tmp"), "--kv-disk-dir needs a KV pool and a host tier (--kv-host-bytes)"),
    (("--kv-host-bytes", "1000000", "--kv-disk-dir", "/tmp", "--kv-disk-bytes", str(10 ** 18)),
     "lower --kv-disk-bytes"),
], ids=["cuda-without-gpu", "unknown-device", "port", "budget", "max-active", "users-file", "dialect", "kv-pool",
        "kv-host", "kv-host-negative", "kv-disk-dir", "kv-disk-bytes", "kv-disk-without-host", "kv-disk-too-big"])
def test_bad_startup_options_are_one_line(tmp_path, args, message):
    refused = _serve("--data-dir", str(tmp_path / "data"), "--port", "0", *args, log=tmp_path / "log")
    assert refused.returncode == 2 and "serving" not in refused.stdout
    line = refused.stderr.strip()
    assert line.startswith("quail: error: ") and message in line and "\n" not in line, refused.stderr


def test_serve_settles_device_precision_and_budget_for_the_machine_and_says_so(tmp_path):
    """No --device, --precision or --token-budget: on a machine without a GPU the server runs on the CPU in
    fp32 with 1,024 tokens a pass, and its startup log line says what it chose."""
    import signal

    log = tmp_path / "log"
    server = _launch("--port", "0", "--data-dir", str(tmp_path / "data"), log=log)
    try:
        assert server.stdout.readline().startswith("quail: serving grpc://")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    err = log.read_text()
    expected = "on cuda" if _has_cuda() else "on cpu, fp32, token budget 1,024, KV pool 1.0 GiB"
    assert expected in err, err
