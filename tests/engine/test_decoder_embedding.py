"""A decoder as the embedding model (`--embed-model`): its embeddings against HF transformers' final hidden state
at the last token on the same token ids, the end-of-text token appended; too-long texts refused; a model that
does not load refused at start."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quail.engine.errors import Cancelled, InvalidArgument, NotFound
from quail.engine.model.config import EngineConfig
from quail.engine.runtime.decoder_embedding import END_OF_TEXT
from quail.engine.runtime.loading import load_embeddings

TEXTS = ["The soup was cold.", "great pasta, and the wine!", "x", "a longer text " * 20]


@pytest.fixture(scope="module")
def embeddings(hf_gguf):
    return load_embeddings(EngineConfig(embed_model=str(hf_gguf)))


def test_embeddings_are_hf_transformers_last_token_hidden_state_normalized(embeddings, hf_model):
    model = embeddings.model()
    assert embeddings.dims == hf_model.config.hidden_size == model.dims
    rows = model.tokens(TEXTS)
    end = model.runtime.tokenizer.token_id(END_OF_TEXT)
    assert end is not None and all(row[-1] == end for row in rows), "the end-of-text token closes each text"
    got = np.array(embeddings.embed(TEXTS))
    with torch.no_grad():
        want = [hf_model.model(input_ids=torch.from_numpy(row.astype(np.int64))[None]).last_hidden_state[0, -1]
                for row in rows]
    want = torch.nn.functional.normalize(torch.stack(want), dim=-1).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert embeddings.computed == len(TEXTS) and embeddings.embed(TEXTS[:1])[0] is not None
    assert embeddings.cached == 1, "a text embedded before is not computed again"


def test_the_model_runs_once_at_load_before_any_text(hf_gguf):
    """Loading runs the layers once (on a GPU their compiled parts are built then), so the first statement that
    embeds does not wait for first calls."""
    loaded = load_embeddings(EngineConfig(embed_model=str(hf_gguf)))
    assert loaded.computed == 0 and loaded.model().runtime.scheduler.busy.seconds() > 0


def test_a_text_longer_than_the_context_is_refused(embeddings):
    context = embeddings.model().runtime.config.max_position
    with pytest.raises(InvalidArgument, match=f"reads at most {context:,}"):
        embeddings.embed(["word " * (context + 10)])


def test_an_embedding_model_that_does_not_load_is_refused():
    with pytest.raises(NotFound, match="no-such-org/no-such-embedder"):
        load_embeddings(EngineConfig(embed_model="no-such-org/no-such-embedder"))


def test_a_stop_ends_the_embedding_passes_before_the_next_one(embeddings):
    """What DuckDB's batch of texts waits on: the statement's check runs before each of the model's passes (a
    cancel or time limit stops the batch within one pass), and nothing stopped is kept."""
    texts = [f"text {k}: " + "a few more words " * 30 for k in range(40)]  # ~4,000 tokens: several passes
    checks = []

    def stop() -> None:
        checks.append(1)
        if len(checks) == 2:
            raise Cancelled("the query was cancelled")

    computed = embeddings.computed
    with pytest.raises(Cancelled):
        embeddings.embed(texts, stop)
    assert len(checks) == 2 and embeddings.computed == computed, "stopped at its second pass, nothing kept"
    assert len(embeddings.embed(texts[:2])) == 2, "the model embeds on"
