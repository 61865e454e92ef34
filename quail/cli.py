"""The `quail` command line: `serve` runs a Flight SQL server, `load` fills a table from a file, `sql` is a shell."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from quail.engine.errors import QuailError


def _serve(args: argparse.Namespace) -> int:
    from quail.engine.model.config import EngineConfig
    from quail.server.admission import Limits
    from quail.server.config import ServerConfig

    optional_path = lambda value: Path(value) if value else None  # noqa: E731
    engine = EngineConfig(model=args.model, device=args.device, precision=args.precision,
                          token_budget=args.token_budget, tokenizer=args.tokenizer, sol_device=args.sol_device,
                          kv_cache_bytes=args.kv_cache_bytes, kv_host_bytes=args.kv_host_bytes,
                          kv_disk_dir=args.kv_disk_dir, kv_disk_bytes=args.kv_disk_bytes,
                          attention=args.attention, replicas=None if args.replicas == "auto" else int(args.replicas),
                          ray=args.ray, embed_model=args.embed_model, decisions=args.decisions)
    config = ServerConfig(host=args.host, port=args.port, data_dir=Path(args.data_dir), engine=engine,
                          dialect=args.dialect, users_file=optional_path(args.users), token_ttl_s=args.token_ttl,
                          tls_cert=optional_path(args.tls_cert), tls_key=optional_path(args.tls_key),
                          public_without_auth=args.public_without_auth,
                          limits=Limits(args.max_active, args.max_requests, args.query_timeout, args.max_tokens,
                                        args.max_generated_tokens, args.max_statement_bytes),
                          metrics_port=args.metrics_port, memory_limit=args.memory_limit,
                          transaction_idle_s=args.transaction_idle, max_message_bytes=args.max_message_bytes)
    config.check()  # before the server's imports (torch, gRPC): a bad option is refused in a moment
    from quail.server.app import serve

    serve(config)
    return 0


def _load(args: argparse.Namespace) -> int:
    import pyarrow as pa
    from adbc_driver_manager import Error as DriverError

    from quail.loader import bar, load
    from quail.remote import connect, error_reason

    started = time.monotonic()
    try:
        with connect(args.uri, **_login(args)) as connection:
            rows = load(connection, Path(args.file), args.table, args.mode, args.format,
                        bar(sys.stderr) if sys.stderr.isatty() else lambda share, rows: None)
    except (DriverError, pa.ArrowException) as err:  # the server's refusal, or a file that does not parse
        print(f"\nquail: error: nothing was loaded into {args.table}: {error_reason(err)}", file=sys.stderr)
        return 1
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"loaded {rows:,} rows into {args.table} in {time.monotonic() - started:.1f} s")
    return 0


def _sql(args: argparse.Namespace) -> int:
    from quail.shell import run

    return run(args, _login(args))


def _login(args: argparse.Namespace) -> dict[str, str]:
    """The ADBC options of --user and --password (asked for on a terminal when not given)."""
    if not args.user:
        return {}
    password = args.password
    if password is None and sys.stdin.isatty():
        import getpass

        password = getpass.getpass(f"password for {args.user}: ")
    return {"username": args.user, "password": password or ""}


def _replicas(value: str) -> str:
    if value != "auto" and not (value.isdigit() and int(value) >= 1):
        raise argparse.ArgumentTypeError(f"{value!r} is not a replica count (1 or more, or auto)")
    return value


def parser() -> argparse.ArgumentParser:
    from quail.engine.model.config import ATTENTION, DECISIONS
    from quail.planner.cost import DEVICES
    from quail.server.admission import MAX_STATEMENT_BYTES
    from quail.server.config import MAX_MESSAGE_BYTES, TRANSACTION_IDLE_S

    top = argparse.ArgumentParser(prog="quail", description="Quail: AI-SQL over Arrow Flight SQL")
    commands = top.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a Flight SQL server")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8815, help="port (default 8815; 0 picks a free one)")
    serve.add_argument("--data-dir", default="data", help="directory holding the database file, quail.duckdb "
                       "(default ./data)")
    serve.add_argument("--memory-limit", default=None, help="memory the database may use before it spills to disk, "
                       "e.g. 4GB (default: DuckDB's, 80%% of RAM)")
    serve.add_argument("--transaction-idle", type=float, default=TRANSACTION_IDLE_S,
                       help="seconds an open transaction may go unused before it is rolled back (default %(default)s)")
    serve.add_argument("--model", default=None, help="model name or .gguf path (default: embedded SmolLM2-135M)")
    serve.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: cuda when a CUDA GPU "
                       "is present, else cpu)")
    serve.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp8"],
                       help="fp32 (CPU), bf16 or fp8 (e4m3 linear layers) on a GPU (default auto: bf16 on a GPU, fp32 on the CPU)")
    serve.add_argument("--token-budget", type=int, default=None,
                       help="new tokens per forward pass (default 16384 on a GPU, 1024 on the CPU)")
    serve.add_argument("--tokenizer", default=None, help="HF tokenizer directory for dummy:<shape> weights")
    serve.add_argument("--sol-device", default=None, choices=sorted(DEVICES),
                       help="device constants of the speed-of-light figures (default: cpu on the CPU, else none)")
    serve.add_argument("--kv-cache-bytes", type=int, default=None,
                       help="the KV pool, where what queries compute stays for later ones (default 1 GiB on the CPU; on a GPU, 90%% of the memory the weights and a pass leave free)")
    serve.add_argument("--kv-host-bytes", type=int, default=None,
                       help="pinned host memory for KV the pool has no room for, copied back when a query needs it "
                            "again and copying timed faster than computing at warm-up (default: on a GPU, half the "
                            "host memory available at start, pinned as it fills; on the CPU none; 0: none)")
    serve.add_argument("--kv-disk-dir", default=None,
                       help="a local directory where a file (unlinked at once: nothing is left behind) takes the KV "
                            "the host tier has no room for, copied back when a query needs it again (default: none)")
    serve.add_argument("--kv-disk-bytes", type=int, default=None,
                       help="the size of that file (default: half the directory's free disk space)")
    serve.add_argument("--attention", default=None, choices=ATTENTION,
                       help="own-token attention: rows padded per length bucket (cuDNN), or one flash varlen "
                            "call (default: varlen on CUDA in bf16/fp8)")
    serve.add_argument("--replicas", default="1", type=_replicas,
                       help="runtimes serving the model: N, or auto (one per CUDA GPU present); the server's own "
                            "and the others in processes of their own, each request sent to the one holding its "
                            "document (default 1)")
    serve.add_argument("--ray", default=None, metavar="ADDRESS",
                       help="run the other replicas as actors of the Ray cluster at ADDRESS, or of a local one "
                            "started here (auto); needs pip install quail-server[ray] (default: processes of "
                            "this host)")
    serve.add_argument("--embed-model", default=None, metavar="NAME_OR_PATH",
                       help="the model AI_EMBED and AI_SIMILARITY embed with: a decoder (HF directory, .gguf file, "
                            "HF repo id in the local cache, or dummy:qwen3-embedding-0.6b / -4b), its last token's "
                            "final hidden state as Qwen3-Embedding's, loaded at start on the model's device "
                            "(default: the embedded static model, 256 dimensions, fetched on first use)")
    serve.add_argument("--decisions", default="model", choices=DECISIONS,
                       help="how yes/no questions are answered: by the model (default); for benchmarks, hash (by "
                            "the prompt's content hash: random weights) or rule (yes where a document holds a word "
                            "of four letters or more of the question; a category, the first whose words it holds); the passes run in full either way")
    serve.add_argument("--dialect", default="snowflake", help="SQL dialect: snowflake, bigquery or duckdb")
    serve.add_argument("--users", default=None, help="file of user:password lines: clients must log in")
    serve.add_argument("--token-ttl", type=float, default=3600.0, help="seconds a login token lasts (default 3600)")
    serve.add_argument("--tls-cert", default=None, help="PEM certificate: serve grpc+tls (with --tls-key)")
    serve.add_argument("--tls-key", default=None, help="PEM private key of the certificate")
    serve.add_argument("--public-without-auth", action="store_true",
                       help="allow a non-loopback --host without --users (anyone who can reach it gets in)")
    serve.add_argument("--max-active", type=int, default=64,
                       help="queries running or waiting for the model at once; more are refused (default 64)")
    serve.add_argument("--max-requests", type=int, default=None, help="model requests one query may make")
    serve.add_argument("--max-tokens", type=int, default=None,
                       help="prompt tokens one query may send the model (every prompt in full), checked per AI "
                            "step before it runs")
    serve.add_argument("--max-generated-tokens", type=int, default=None,
                       help="tokens one query may generate (AI_COMPLETE and friends), checked before every pass")
    serve.add_argument("--query-timeout", type=float, default=None,
                       help="seconds one query may take, planning included")
    serve.add_argument("--max-statement-bytes", type=int, default=MAX_STATEMENT_BYTES,
                       help="bytes of one statement's text; a longer one is refused (default %(default)s)")
    serve.add_argument("--max-message-bytes", type=int, default=MAX_MESSAGE_BYTES,
                       help="bytes of one message a client sends (a statement with its parameters, one batch "
                            "of an ingest: ingests of any size go in batches below it); a longer one is refused "
                            "(default %(default)s)")
    serve.add_argument("--metrics-port", type=int, default=None,
                       help="serve Prometheus metrics at http://HOST:PORT/metrics (default: not served)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="server log level on stderr (default info)")
    serve.set_defaults(run=_serve)
    load = commands.add_parser("load", help="load a CSV, Parquet, JSON lines or Arrow file into a table")
    load.add_argument("file", help="the file, read here (a .csv, .tsv, .parquet, .jsonl, .json, .arrow or .feather)")
    load.add_argument("table", help="the table to load it into")
    load.add_argument("uri", nargs="?", default="grpc://127.0.0.1:8815",
                      help="the server (default grpc://127.0.0.1:8815; grpc+tls:// for TLS)")
    load.add_argument("--mode", default="create", choices=["create", "append", "replace"],
                      help="create the table (default), append to it, or replace it")
    load.add_argument("--format", default=None, choices=["csv", "parquet", "json", "arrow"],
                      help="the file's format (default: by its extension)")
    load.add_argument("--user", default=None, help="log in as this user (a server with --users)")
    load.add_argument("--password", default=None, help="the user's password")
    load.set_defaults(run=_load)
    shell = commands.add_parser("sql", help="a SQL shell on a server (or run -c SQL / -f FILE and exit)")
    shell.add_argument("uri", nargs="?", default="grpc://127.0.0.1:8815",
                       help="the server (default grpc://127.0.0.1:8815; grpc+tls:// for TLS)")
    script = shell.add_mutually_exclusive_group()
    script.add_argument("-c", "--command", default=None, help="run these statements and exit (1 on an error)")
    script.add_argument("-f", "--file", default=None, help="run the statements of this file (- for stdin) and exit")
    shell.add_argument("--format", default="table", choices=["table", "csv", "json", "arrow"],
                       help="results as aligned tables (default), CSV, JSON lines or an Arrow IPC stream")
    shell.add_argument("--max-rows", type=int, default=40, help="rows a table shows at most (default 40; 0: all)")
    shell.add_argument("--dialect", default=None, help="SQL dialect: snowflake, bigquery or duckdb (default: "
                       "the server's)")
    shell.add_argument("--user", default=None, help="log in as this user (a server with --users)")
    shell.add_argument("--password", default=None, help="the user's password (asked for when not given)")
    shell.add_argument("--tls-root-certs", default=None, metavar="PEM",
                       help="trust the server certificates this PEM file signs (e.g. a self-signed one)")
    shell.add_argument("--tls-skip-verify", action="store_true", help="do not verify the server's certificate")
    shell.add_argument("--tls-override-hostname", default=None, metavar="NAME",
                       help="the host name the server's certificate must name")
    shell.set_defaults(run=_sql)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "info").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        return args.run(args)
    except (QuailError, ValueError, OSError) as err:
        print(f"quail: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
