"""Shared fixtures: the embedded model in-process, HF transformers' reading of the same GGUF, a server."""

from __future__ import annotations

import os

import pytest

from quail.clients.server_process import ServerProcess
from quail.engine.models import embedded_gguf, load_runtime

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def runtime():
    return load_runtime()


@pytest.fixture(scope="session")
def hf_model():
    """SmolLM2 as transformers loads it from the same GGUF (its own dequantization), fp32."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = embedded_gguf()
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


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
