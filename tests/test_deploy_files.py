"""deploy/: files parse, name only exported metrics and flags `quail serve` takes; the health check works."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Iterator, NamedTuple

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import quail.cli
from quail.clients.server_process import ServerProcess, free_port
from quail.server import health
from quail.server.config import ServerConfig
from quail.server.auth import load_users
from tests.tls_certs import self_signed

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
HEALTHCHECK = DEPLOY / "healthcheck.py"
DOCKERFILES = ("Dockerfile", "Dockerfile.cuda")
SERVER_NAME = "quail.example"  # the only name in the test certificate: the check must be told it
SAMPLE_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                   "summary": ("", "_count", "_sum", "_created")}


def _load_healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_healthcheck", HEALTHCHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(*patterns: str) -> list[Path]:
    return sorted(path for pattern in patterns for path in DEPLOY.rglob(pattern))


def _yaml(relative: str) -> list:
    return list(yaml.safe_load_all((DEPLOY / relative).read_text()))


def _logical_lines(path: Path) -> list[str]:
    """The file's lines with backslash continuations joined (Dockerfile and systemd alike)."""
    return re.sub(r"\\\n\s*", " ", path.read_text()).splitlines()


def _dockerfile(name: str, instruction: str) -> list[str]:
    """The arguments of a Dockerfile instruction: exec form (JSON) as its list, else split on whitespace."""
    line = next(line for line in _logical_lines(DEPLOY / name) if line.startswith(instruction + " "))
    rest = line.split(None, 1)[1]
    return json.loads(rest) if rest.startswith("[") else rest.split()


def _serve_args(argv: list[str]) -> list[str]:
    """What follows `quail serve` in a command line (after tini, a path to quail, ...)."""
    return argv[argv.index("serve") + 1:]


def _deployment() -> dict:
    [deployment] = _yaml("k8s/base/deployment.yaml")
    return deployment


def _container() -> dict:
    return _deployment()["spec"]["template"]["spec"]["containers"][0]


def _tls_patch() -> list[dict]:
    [patch] = _yaml("k8s/tls/deployment-patch.yaml")
    return patch


def _compose_command() -> list[str]:
    [compose] = _yaml("docker-compose.yml")
    quail_service = compose["services"]["quail"]
    assert quail_service["build"]["dockerfile"] == "deploy/Dockerfile"
    return _serve_args(_dockerfile("Dockerfile", "ENTRYPOINT")) + quail_service["command"]


def _systemd_command() -> list[str]:
    line = next(line for line in _logical_lines(DEPLOY / "quail.service") if line.startswith("ExecStart="))
    return _serve_args(shlex.split(line.removeprefix("ExecStart=")))


def _ray_command() -> list[str]:
    [cluster] = _yaml("ray/cluster.yaml")
    line = next(line for line in cluster["head_start_ray_commands"] if "quail serve" in line)
    return _serve_args(shlex.split(line.removeprefix("nohup ").split(">")[0]))


COMMANDS = {
    "ray": _ray_command,
    "docker-compose": _compose_command,
    "k8s": lambda: _serve_args(_container()["command"]) + _container()["args"],
    "k8s-tls": lambda: _serve_args(_container()["command"]) + _container()["args"] + [
        op["value"] for op in _tls_patch() if op["path"].endswith("/args/-")],
    "systemd": _systemd_command,
}


def _config(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> ServerConfig:
    """The ServerConfig the real command line builds from `quail serve ARGS` (serving replaced by keeping it,
    its checks left to the caller)."""
    kept: list[ServerConfig] = []
    monkeypatch.setattr("quail.server.app.serve", kept.append)
    with pytest.MonkeyPatch.context() as unchecked:
        unchecked.setattr(ServerConfig, "check", lambda self: None)
        parsed = quail.cli.parser().parse_args(["serve", *args])
        assert parsed.run(parsed) == 0
    return kept[0]


@pytest.mark.parametrize("path", _files("*.yml", "*.yaml"), ids=lambda path: str(path.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path):
    documents = list(yaml.safe_load_all(path.read_text()))
    assert documents and all(isinstance(document, (dict, list)) for document in documents)


@pytest.mark.parametrize("path", _files("*.json"), ids=lambda path: str(path.relative_to(DEPLOY)))
def test_every_json_file_parses(path):
    assert isinstance(json.loads(path.read_text()), dict)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_serve_on_the_ports_they_expose_and_refuse_to_start_open(monkeypatch, name):
    """The ENTRYPOINT's flags parse; alone they are refused (off loopback the user must add --users or say
    --public-without-auth); the ports match EXPOSE, the data directory the VOLUME."""
    config = _config(monkeypatch, _serve_args(_dockerfile(name, "ENTRYPOINT")))
    with pytest.raises(ValueError, match="without authentication"):
        config.check()
    assert {str(config.port), str(config.metrics_port)} == set(_dockerfile(name, "EXPOSE"))
    assert [str(config.data_dir)] == _dockerfile(name, "VOLUME")
    assert _dockerfile(name, "STOPSIGNAL") == ["SIGTERM"]
    assert " ".join(_dockerfile(name, "HEALTHCHECK")).endswith('CMD ["python", "/usr/local/lib/quail/healthcheck.py"]')
    assert "deploy/healthcheck.py /usr/local/lib/quail/healthcheck.py" in (DEPLOY / name).read_text()


@pytest.mark.parametrize("where", sorted(COMMANDS))
def test_deploy_command_lines_pass_the_servers_startup_checks(monkeypatch, where):
    config = _config(monkeypatch, COMMANDS[where]())
    config.check()
    assert (config.host, config.port, config.metrics_port, config.data_dir) == (
        "0.0.0.0", 8815, 9815, Path("/var/lib/quail"))


def test_kubernetes_probes_service_and_grace_match_the_server(monkeypatch):
    config = _config(monkeypatch, COMMANDS["k8s"]())
    spec, container = _deployment()["spec"]["template"]["spec"], _container()
    assert config.engine.device == "cuda" and container["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == config.port
    [service] = _yaml("k8s/base/service.yaml")
    assert {port["port"] for port in service["spec"]["ports"]} == {config.port, config.metrics_port}
    assert spec["terminationGracePeriodSeconds"] >= 30
    replaced = {op["path"].rsplit("/", 1)[1]: op["value"] for op in _tls_patch() if op["op"] == "replace"}
    assert {probe["exec"]["command"][1] for probe in replaced.values()} == {"/usr/local/lib/quail/healthcheck.py"}


def test_example_secrets_agree(tmp_path):
    """The metrics user of the example Secrets is an admin of the example users file, with the same password."""
    secrets = {document["metadata"]["name"]: document["stringData"] for document in _yaml("k8s/secrets.example.yaml")}
    (tmp_path / "users").write_text(secrets["quail-users"]["users"])
    user = load_users(tmp_path / "users")[secrets["quail-metrics"]["username"]]
    assert (user.role, user.password) == ("admin", secrets["quail-metrics"]["password"])


def test_healthcheck_encodes_and_decodes_as_the_server_does():
    check = _load_healthcheck()
    request, response = health.MESSAGES["HealthCheckRequest"], health.MESSAGES["HealthCheckResponse"]
    for name in health.NAMES + ("x" * 300,):
        assert check.request(name) == request(service=name).SerializeToString()
    for value in (0, health.SERVING, health.NOT_SERVING, health.SERVICE_UNKNOWN):
        assert check.status(response(status=value).SerializeToString()) == value


def _healthcheck(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run([sys.executable, str(HEALTHCHECK), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stdout.strip()


@pytest.fixture
def health_only() -> Iterator[tuple[health.Health, str]]:
    """The server's health service alone, in this process, on a loopback port."""
    service, server = health.Health(), grpc.server(ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((service.generic_handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield service, f"127.0.0.1:{port}"
    server.stop(None)


def test_healthcheck_exits_0_only_while_serving(health_only):
    service, address = health_only
    assert _healthcheck(address) == (0, "SERVING")
    assert _healthcheck(address, "--service", "arrow.flight.protocol.FlightService") == (0, "SERVING")
    assert _healthcheck(address, "--service", "no.such.Service") == (1, "unhealthy: NOT_FOUND")
    service.stopping()
    assert _healthcheck(address) == (1, "NOT_SERVING")
    assert _healthcheck(f"127.0.0.1:{free_port()}", "--timeout", "2") == (1, "unhealthy: UNAVAILABLE")


class Served(NamedTuple):
    address: str
    cert: Path
    metrics_url: str


ADMIN = ("prometheus", "scrape-pass")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    """One real server as the deploy files run it: users, TLS and metrics."""
    root = tmp_path_factory.mktemp("deploy")
    cert, key = self_signed(root, SERVER_NAME, ip=None)
    (root / "users").write_text("analyst:a-pass\n{}:{}:admin\n".format(*ADMIN))
    port = free_port()
    with ServerProcess(root / "data", "--users", str(root / "users"), "--tls-cert", str(cert), "--tls-key", str(key),
                       "--metrics-port", str(port)) as server:
        yield Served(server.uri.removeprefix("grpc+tls://"), cert, f"http://127.0.0.1:{port}/metrics")


def test_healthcheck_reads_a_real_server_over_tls(served):
    """As the images and the k8s TLS overlay run it: the settings from the environment."""
    env = {"QUAIL_HEALTH_ADDRESS": served.address, "QUAIL_HEALTH_TLS_CA": str(served.cert)}
    assert _healthcheck(env={**env, "QUAIL_HEALTH_SERVER_NAME": SERVER_NAME}) == (0, "SERVING")
    assert _healthcheck("--timeout", "3", env=env)[0] == 1, "the certificate does not name 127.0.0.1"
    assert _healthcheck(served.address, "--timeout", "3")[0] == 1, "plaintext to a TLS port"


def test_metrics_need_an_admin(served):
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(served.metrics_url, timeout=30)


def test_dashboard_and_prometheus_use_only_metrics_the_server_exports(served):
    credentials = base64.b64encode(":".join(ADMIN).encode()).decode()
    request = urllib.request.Request(served.metrics_url, headers={"Authorization": f"Basic {credentials}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        families = list(text_string_to_metric_families(response.read().decode()))
    exported = {family.name + suffix for family in families for suffix in SAMPLE_SUFFIXES.get(family.type, ("",))}
    used = {name for path in _files("*.json", "prometheus.yml")
            for name in re.findall(r"\bquail_[a-z0-9_]+", path.read_text())}
    assert used, "the dashboard names no metric"
    assert used <= exported, f"not exported by the server: {sorted(used - exported)}"
