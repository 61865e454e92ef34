"""HF safetensors directories, the HF cache, and fp8: tiny random models saved by transformers, checked against HF."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quail.engine.errors import InvalidArgument, NotFound
from quail.engine.kernels.fp8 import Fp8Linear
from quail.engine.model.config import EngineConfig
from quail.engine.runtime.loading import export_embedded_tokenizer, load_runtime, settled
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request

transformers = pytest.importorskip("transformers")
VOCAB = 49152  # the embedded tokenizer's, so its ids index the tiny model
TEXTS = ["The soup was cold.", "Fast delivery, the box was crushed though.", "Five stars! " * 20]


def _tiny(arch: str):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512)
    if arch == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(tie_word_embeddings=False, **common))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=True, **common))


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def saved(request, tmp_path_factory):
    """An HF model directory as save_pretrained writes it, with the embedded tokenizer beside the weights."""
    torch.manual_seed(0)
    model = _tiny(request.param).eval()
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory, safe_serialization=True)
    export_embedded_tokenizer(directory)
    return directory, model


def _requests(runtime) -> list[Request]:
    from quail.engine.ai.asking import Question, build_requests

    return build_requests(runtime, Question("Is {0} a complaint?"), [[t] for t in TEXTS])


def _hf_logprobs(model, request: Request) -> np.ndarray:
    with torch.inference_mode():
        logits = model(torch.from_numpy(request.ids().astype(np.int64))[None]).logits[0, -1].double()
    labels = request.labels
    logp = torch.log_softmax(logits[list(labels.token_ids)], dim=-1)
    groups = torch.tensor(labels.groups)
    return np.array([float(torch.logsumexp(logp[groups == g], dim=-1)) for g in range(len(labels.names))])


def test_safetensors_directory_matches_hf(saved):
    directory, model = saved
    runtime = load_runtime(EngineConfig(model=str(directory)))
    assert runtime.model_id == directory.name
    requests = _requests(runtime)
    ours = runtime.score(requests, QueryWork())
    for request, got in zip(requests, ours):
        np.testing.assert_allclose(got, _hf_logprobs(model, request), atol=1e-4)


def test_repo_id_resolves_from_the_hf_cache(saved, tmp_path, monkeypatch):
    directory, model = saved
    repo = tmp_path / "hub" / "models--someorg--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(directory, target_is_directory=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    runtime = load_runtime(EngineConfig(model="someorg/tiny"))
    request = _requests(runtime)[0]
    np.testing.assert_allclose(runtime.score([request])[0], _hf_logprobs(model, request), atol=1e-4)
    with pytest.raises(NotFound, match="someorg/absent"):
        load_runtime(EngineConfig(model="someorg/absent"))


def test_fp8_linear_error_is_bounded():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 384).to(torch.bfloat16)
    x = torch.randn(37, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        want, got = linear(x).float(), Fp8Linear(linear)(x).float()
    # e4m3 keeps 3 mantissa bits: about 2^-4 relative error per element, averaging down over k = 256.
    assert float((got - want).norm() / want.norm()) < 0.06


def test_fp8_runtime_agrees_with_bf16(saved):
    directory, _ = saved
    answers = {}
    for precision in ("bf16", "fp8"):
        runtime = load_runtime(EngineConfig(model=str(directory), precision=precision))
        assert any(isinstance(m, Fp8Linear) for m in runtime.runner.model.modules()) == (precision == "fp8")
        answers[precision] = np.array(runtime.score(_requests(runtime)))
    assert np.abs(np.exp(answers["fp8"]) - np.exp(answers["bf16"])).max() < 0.05


def test_attention_layout_is_varlen_on_cuda_in_bf16_and_fp8_only():
    assert EngineConfig().attention_layout == "buckets"
    assert EngineConfig(device="cuda", precision="bf16").attention_layout == "varlen"
    assert EngineConfig(device="cuda", precision="fp8").attention_layout == "varlen"
    assert EngineConfig(device="cuda", precision="fp32").attention_layout == "buckets"
    assert EngineConfig(device="cuda", precision="bf16", attention="buckets").attention_layout == "buckets"
    with pytest.raises(InvalidArgument, match="runs on a CUDA device in bf16 or fp8"):
        load_runtime(EngineConfig(attention="varlen"))
    with pytest.raises(InvalidArgument, match="attention 'dense' is not available"):
        load_runtime(EngineConfig(attention="dense"))


def test_auto_settles_for_the_machine(monkeypatch):
    """"auto" and an unset budget: bf16 and 16,384 tokens on a GPU, fp32 and 1,024 on the CPU; what is given
    stays."""
    auto = EngineConfig(device="auto", precision="auto", token_budget=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = settled(auto)
    assert (cpu.device, cpu.precision, cpu.token_budget) == ("cpu", "fp32", 1024)
    assert settled(EngineConfig(device="auto", precision="bf16", token_budget=512)).precision == "bf16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpu = settled(auto)
    assert (gpu.device, gpu.precision, gpu.token_budget) == ("cuda", "bf16", 16384)
