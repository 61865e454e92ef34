"""The embedded static embedding model against a reference pooling written here, and the server's embeddings
(kept by tokens across queries, NULL for no text) as DuckDB runs them."""

from __future__ import annotations

import json
import struct

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer

from quail.engine.errors import InvalidArgument
from quail.engine.exec.embedding_functions import cosine, register
from quail.engine.model.embedded import WORD_EMBEDDINGS, WORD_TOKENIZER, WORDLLAMA
from quail.engine.model import static_embedding
from quail.engine.model.static_embedding import read_safetensors
from quail.engine.runtime.embeddings import EMBEDDED_DIMS, ENTRY_BYTES, Embeddings, embedded_model

TEXTS = ["The soup was cold.", "great pasta, and the wine!", "a", "  spaced   out  ", "émigré café naïve"]


@pytest.fixture(scope="module")
def files():
    return WORDLLAMA.files()


def reference(files, texts: list[str]) -> np.ndarray:
    """The model as its description reads, computed apart: the safetensors file's one table read by hand, each
    text's token ids (no special tokens) looked up, averaged in float64, divided by the L2 norm."""
    data = files[WORD_EMBEDDINGS].read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    (name, entry), = [(k, v) for k, v in json.loads(data[8:8 + size]).items() if k != "__metadata__"]
    assert entry["dtype"] == "F16"
    start, end = entry["data_offsets"]
    table = np.frombuffer(data[8 + size + start:8 + size + end], dtype="<f2").reshape(entry["shape"]).astype(np.float64)
    tokenizer = Tokenizer.from_file(str(files[WORD_TOKENIZER]))
    out = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        mean = table[ids].mean(axis=0)
        out.append(mean / np.linalg.norm(mean))
    return np.array(out)


def test_the_static_model_is_the_mean_of_its_token_vectors_normalized(files):
    model = embedded_model()
    assert model.dims == EMBEDDED_DIMS and model.vectors.shape[1] == EMBEDDED_DIMS
    got = np.array(model.embed_ids(model.tokens(TEXTS)))
    np.testing.assert_allclose(got, reference(files, TEXTS), atol=1e-6)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_the_static_model_pools_each_text_alone_whatever_the_groups_its_rows_are_gathered_in(files, monkeypatch):
    """Rows gathered a few tokens at a time (a text longer than the bound alone), an empty text among them."""
    model = embedded_model()
    monkeypatch.setattr(static_embedding, "POOLED_TOKENS", 4)
    texts = [TEXTS[0], "", *TEXTS[1:]]
    got = model.embed_ids(model.tokens(texts))
    assert got[1] is None
    np.testing.assert_allclose(np.array([got[0], *got[2:]]), reference(files, TEXTS), atol=1e-6)


def test_the_safetensors_reader_reads_what_it_describes(tmp_path):
    tensor = np.arange(12, dtype=np.float32).reshape(3, 4)
    header = json.dumps({"__metadata__": {"format": "np"},
                         "t": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, tensor.nbytes]}}).encode()
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + tensor.tobytes())
    np.testing.assert_array_equal(read_safetensors(path)["t"], tensor)


def test_a_text_is_embedded_once_and_kept_by_its_tokens():
    embeddings = Embeddings(max_bytes=2 * 4 * EMBEDDED_DIMS + 4 * ENTRY_BYTES + 64)  # room for two, and their texts
    first = embeddings.embed(["the soup", "the soup", None, "", "cold"])
    assert first[2] is None and first[3] is None, "no text, and a text of no tokens, have no embedding"
    np.testing.assert_array_equal(first[0], first[1])
    assert (embeddings.computed, embeddings.cached) == (3, 1), "the empty text's None is kept like any other"
    embeddings.embed(["the soup"])
    assert embeddings.computed == 4, "the least recently used went first: two fit"


def test_what_is_kept_is_bounded_by_its_weight_the_least_recently_used_going_first():
    """Each text weighs its vector, its token ids, its text and ENTRY_BYTES twice: a bound for ten such texts keeps
    the last ten of thirty and drops the first."""
    texts = [f"review number {i} of the soup" for i in range(30)]
    one = 4 * EMBEDDED_DIMS + 2 * ENTRY_BYTES + len(texts[0]) + 64  # a text's tokens: a few int32s
    embeddings = Embeddings(max_bytes=10 * one)
    embeddings.embed(texts)
    assert embeddings.computed == 30
    embeddings.embed(texts[-8:])
    assert (embeddings.computed, embeddings.cached) == (30, 8), "the last ones kept"
    embeddings.embed(texts[:3])
    assert embeddings.computed == 33, "the first ones went"


def test_embeddings_in_duckdb_a_fixed_size_array_null_for_null_and_one_model():
    con = duckdb.connect()
    register(con, Embeddings())
    table = con.sql("SELECT ai_embed('default', 'soup') AS e, ai_embed('default', NULL) AS n, "
                    "ai_embed('default', '') AS empty").to_arrow_table()
    assert table.schema.field("e").type == pa.list_(pa.float32(), EMBEDDED_DIMS)
    assert table.column("n").to_pylist() == [None] and table.column("empty").to_pylist() == [None]
    with pytest.raises(duckdb.InvalidInputException, match="InvalidArgument: AI_EMBED's model 'other'"):
        con.execute("SELECT ai_embed('other', 'soup')").fetchall()


def test_cosine_of_lists_null_where_either_is_and_refused_across_sizes():
    a = pa.array([[1.0, 0.0], None, [0.0, 0.0], [2.0, 2.0]], pa.list_(pa.float32()))
    b = pa.array([[0.0, 1.0], [1.0, 1.0], [1.0, 1.0], None], pa.list_(pa.float32()))
    assert cosine(a, b).to_pylist() == [0.0, None, None, None]
    mixed = cosine(pa.array([[1.0, 0.0], [1.0, 0.0, 0.0]]), pa.array([[1.0, 0.0], [0.0, 1.0, 0.0]]))
    assert mixed.to_pylist() == [1.0, 0.0], "rows of different lengths, each pair alike: each row's cosine"
    with pytest.raises(InvalidArgument, match="as many dimensions"):
        cosine(pa.array([[1.0, 0.0]]), pa.array([[1.0, 0.0, 0.0]]))


def test_explain_analyze_and_the_metrics_count_the_texts_embedded(runtime):
    """A step's line says what the embedding model did meanwhile; the metrics count it for the server."""
    from prometheus_client import generate_latest

    import quail
    from quail.server.metrics import Metrics

    session = quail.Session(runtime=runtime)
    session.register("docs", pa.table({"id": [1, 2, 3], "body": ["counted soup", "counted soup", None]}))
    metrics = Metrics(runtime)
    before = runtime.embeddings.counts()
    lines = session.sql("EXPLAIN ANALYZE SELECT id, AI_SIMILARITY(body, 'counted query') AS s FROM docs",
                        dialect="duckdb").run().table.column(0).to_pylist()
    assert "texts embedded: 2 computed, 1 kept from before, 1 NULL" in lines[0]
    assert runtime.embeddings.counts().minus(before).computed == 2
    exposed = generate_latest(metrics.registry).decode()
    assert f'quail_embedded_texts_total{{kind="computed"}} {float(runtime.embeddings.computed)}' in exposed


def test_a_text_seen_before_is_not_tokenized_again():
    model, tokenized = embedded_model(), []
    tokens = model.tokens
    model.tokens = lambda texts: (tokenized.extend(texts), tokens(texts))[1]
    embeddings = Embeddings(lambda: model)
    first = embeddings.embed(["soup", "wine", "soup"])
    again = embeddings.embed(["wine", "soup", "bread"])
    assert tokenized == ["soup", "wine", "soup", "bread"], "only the text not seen before"
    np.testing.assert_array_equal(again[1], first[0])
    assert (embeddings.computed, embeddings.cached) == (3, 3)
