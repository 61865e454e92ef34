"""Shared fixtures: the embedded model in-process, HF transformers' reading of the same GGUF, a server."""

from __future__ import annotations

import os

import pytest

import quail
from quail.clients.server_process import ServerProcess
from quail.engine.runtime.loading import embedded_gguf, load_runtime
from tests.sample_tables import ASPECTS, REVIEWS

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def runtime():
    return load_runtime()


@pytest.fixture(autouse=True)
def _no_kv_from_other_tests(request):
    """Each test starts with an empty resident tree, so its token counts do not depend on test order."""
    if "runtime" in request.fixturenames:
        request.getfixturevalue("runtime").runner.tree.clear()


@pytest.fixture(scope="module")
def hash_session(runtime):
    """Sessions over the embedded model that answer yes / no by a hash of each prompt's content (the forward
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
def hf_model():
    """SmolLM2 as transformers loads it from the same GGUF (its own dequantization), fp32."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = embedded_gguf()
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_p_yes(hf_model):
    """P(yes) of a request as HF transformers computes it on the request's token ids."""
    torch = pytest.importorskip("torch")

    def p_yes(request) -> float:
        with torch.inference_mode():
            logits = hf_model(torch.from_numpy(request.ids().astype("int64"))[None]).logits[0, -1]
        labels = request.labels
        logp = torch.log_softmax(logits[list(labels.token_ids)].double(), dim=-1)
        return float(torch.logsumexp(logp[torch.tensor(labels.groups) == 1], dim=-1).exp())

    return p_yes


@pytest.fixture(scope="session")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    path = embedded_gguf()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real `quail serve` process over a fresh data directory."""
    with ServerProcess(tmp_path_factory.mktemp("data")) as proc:
        yield proc
