"""Shared fixtures: the embedded model in-process (or a small one: tests/small_model.py), HF transformers' reading
of the same GGUF, a server."""

from __future__ import annotations

import functools
import os

# Under pytest-xdist each worker, and each server or script it starts (they inherit the environment), gets
# an equal share of the machine's cores for torch's threads: two workers at two threads each on two cores
# (their servers besides) wait on one another, a third slower than one thread each.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                     // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import quail  # noqa: E402
from quail.clients.server_process import ServerProcess  # noqa: E402
from quail.engine.runtime.loading import embedded_gguf, load_runtime  # noqa: E402
from tests.fork_server import ForkServer  # noqa: E402
from tests.sample_tables import ASPECTS, REVIEWS  # noqa: E402
from tests.small_model import small_runtime  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _servers_forked():
    """Every `ServerProcess` of this test process forked from one that has imported the server's modules
    (tests/fork_server.py): about 2 s less a server, of the 3 a fresh interpreter takes to start one."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ServerProcess, "launch", ForkServer().popen)
        yield


@pytest.fixture(scope="session")
def embedded_runtime():
    """The embedded model's runtime, as a server loads it."""
    return load_runtime()


@pytest.fixture(scope="module")
def runtime(request, embedded_runtime):
    """The embedded model's runtime; in a module that sets SMALL_MODEL = True, a small random decoder's behind
    the same tokenizer (tests/small_model.py says when that will do), one for the test session."""
    if not getattr(request.module, "SMALL_MODEL", False):
        return embedded_runtime
    return request.getfixturevalue("_small_runtime")


@pytest.fixture(scope="session")
def _small_runtime(embedded_runtime):
    return small_runtime(embedded_runtime)


@pytest.fixture(autouse=True)
def _no_kv_from_other_tests(request):
    """Each test starts with an empty resident tree, so its token counts do not depend on test order. A module
    whose tests check rows and answers only, never token counts or what is resident, may set
    KV_SHARED_BY_ITS_TESTS = True: its first test starts with an empty tree, and each later one with the tree
    the module's tests before it left (the same documents are not computed again for every test)."""
    if "runtime" not in request.fixturenames:
        return
    if getattr(request.module, "KV_SHARED_BY_ITS_TESTS", False):
        request.getfixturevalue("_no_kv_from_other_modules")
    else:
        request.getfixturevalue("runtime").runner.tree.clear()


@pytest.fixture(scope="module")
def _no_kv_from_other_modules(runtime):
    """The resident tree emptied once, as a module whose tests share it starts."""
    runtime.runner.tree.clear()


@pytest.fixture(scope="module")
def hash_session(runtime):
    """Sessions over the module's runtime that answer yes / no by a hash of each prompt's content (the forward
    passes still run): row sets non-trivial at a stated selectivity, checkable independently of a tiny model."""
    def session(**tables) -> quail.Session:
        made = quail.Session(runtime=runtime.variant("quail"))
        made.runtime.decisions = "hash"
        for name, table in tables.items():
            made.register(name, table)
        return made

    return session


@pytest.fixture(scope="module")
def session(hash_session):
    """The sample reviews and aspects (sample_tables.py) in a session answering by content hash."""
    return hash_session(reviews=REVIEWS, aspects=ASPECTS)


@pytest.fixture(scope="session")
def hf_gguf():
    """The embedded GGUF's path, with gguf's reader of a file and its tensor-name map built once each for the
    session: transformers reads the file once for the config, once for the weights and once for the tokenizer
    (~50,000 metadata fields each time) and builds the same map once a tensor, most of a 25 s load on a CPU
    core. What it reads is unchanged."""
    gguf = pytest.importorskip("gguf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield embedded_gguf()


@pytest.fixture(scope="session")
def hf_model(hf_gguf):
    """SmolLM2 as transformers loads it from the same GGUF (its own dequantization), fp32."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(hf_gguf.parent), gguf_file=hf_gguf.name, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_p_yes(hf_model):
    """P(yes) of a request as HF transformers computes it on the request's token ids (each prompt's
    computed once a session: a test asking again gets the same number)."""
    torch = pytest.importorskip("torch")
    known: dict[tuple, float] = {}

    def p_yes(request) -> float:
        ids, labels = request.ids().astype("int64"), request.labels
        key = (ids.tobytes(), tuple(labels.token_ids), tuple(labels.groups))
        if key not in known:
            with torch.inference_mode():
                logits = hf_model(torch.from_numpy(ids)[None], logits_to_keep=1).logits[0, -1]
            logp = torch.log_softmax(logits[list(labels.token_ids)].double(), dim=-1)
            known[key] = float(torch.logsumexp(logp[torch.tensor(labels.groups) == 1], dim=-1).exp())
        return known[key]

    return p_yes


@pytest.fixture(scope="session")
def hf_generate(hf_model):
    """HF transformers' greedy continuation of each request's token ids, at most `max_tokens` tokens, cut
    before its first stop token (each prompt's computed once a session). Prompts of one length go through one
    `generate` call, unpadded: a decode step of one row reads every weight, as one of many rows does."""
    torch = pytest.importorskip("torch")
    known: dict[tuple, list[int]] = {}

    def generate(requests, max_tokens: int, stop: frozenset[int]) -> list[list[int]]:
        keys = [(request.ids().tobytes(), max_tokens, tuple(sorted(stop))) for request in requests]
        by_length: dict[int, dict[tuple, object]] = {}
        for key, request in zip(keys, requests):
            if key not in known:
                by_length.setdefault(len(request), {})[key] = request
        for group in by_length.values():
            ids = torch.from_numpy(np.stack([request.ids() for request in group.values()]).astype("int64"))
            with torch.inference_mode():
                out = hf_model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=sorted(stop),
                                        pad_token_id=0)[:, ids.shape[1]:].tolist()
            for key, tokens in zip(group, out):
                known[key] = tokens[:next((i for i, token in enumerate(tokens) if token in stop), len(tokens))]
        return [known[key] for key in keys]

    return generate


@pytest.fixture(scope="session")
def hf_tokenizer(hf_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(hf_gguf.parent), gguf_file=hf_gguf.name)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real `quail serve` process over a fresh data directory."""
    with ServerProcess(tmp_path_factory.mktemp("data")) as proc:
        yield proc


# How `make test` spreads the test files over its workers (pytest-xdist, --dist loadfile): each file's tests
# on one worker (its module-scoped servers and fixtures built once), the files that use HF transformers'
# model (about 20 s to load, once a worker) together on one, and the longest first (by a run's durations,
# `pytest --durations`), so that no worker is left running one of them alone at the end.
HF_FIXTURES = ("hf_model", "hf_p_yes", "hf_generate")
HF_GROUP = "files using hf_model, hf_p_yes or hf_generate"
LONGEST_FIRST = (HF_GROUP, "tests/server/test_server_own.py", "tests/server/test_replicas.py",
                 "tests/bench/test_stress.py", "tests/engine/test_scheduler_queries_at_once.py",
                 "tests/test_ai_complete.py", "tests/bench/test_server_load.py", "tests/server/test_server_cancel.py",
                 "tests/test_demo.py", "tests/bench/test_statement_timeline.py",
                 "tests/server/test_cascade_sql.py", "tests/server/test_server_exclusive.py", "tests/bench/test_fuzz.py",
                 "tests/bench/test_bench.py", "tests/server/test_server_limits.py", "tests/test_packaging.py",
                 "tests/server/test_crash.py", "tests/engine/test_host_tier_choice.py",
                 "tests/planner/test_substrait.py", "tests/engine/test_scheduler_passes.py", "tests/test_ai_sql.py",
                 "tests/test_ai_agg.py", "tests/test_shell.py", "tests/engine/test_ai_operators.py",
                 "tests/engine/test_executor.py", "tests/server/test_server_security.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    @functools.cache
    def share(path: str) -> str:
        text = (config.rootpath / path).read_text(errors="replace")
        return HF_GROUP if any(name in text for name in HF_FIXTURES) else path

    class FilesLongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return share(super()._split_scope(nodeid))

        def _assign_work_unit(self, node) -> None:
            rank = {scope: k for k, scope in enumerate(LONGEST_FIRST)}
            for scope in sorted(self.workqueue, key=lambda scope: rank.get(scope, len(rank))):
                self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return FilesLongestFirst(config, log)
