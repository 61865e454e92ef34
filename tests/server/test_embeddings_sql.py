"""AI_EMBED and AI_SIMILARITY through the real ADBC driver: the Arrow type, stored embeddings equal to
recomputed ones, semantic top-k and a similarity join against a brute force computed here, every dialect's
spelling, and bad input."""

from __future__ import annotations

import adbc_driver_manager
import numpy as np
import pyarrow as pa
import pytest

import quail

TOPICS = ["the soup was cold", "the waiter was rude", "great pasta and wine", "the bill was too high",
          "a lovely terrace view", "the bread was stale", "we waited an hour", "the dessert was delicious"]
DOCS = pa.table({"id": pa.array(range(48), pa.int64()),
                 "body": [f"{TOPICS[i % 8]}{'!' * (i // 8)}" if i % 11 else None for i in range(48)]})
QUERIES = pa.table({"qid": [1, 2, 3, 4], "text": ["cold food", "slow service", "an expensive meal", ""]})
DIMS = 256


@pytest.fixture(scope="module")
def uri(server) -> str:
    with quail.connect(server.uri, dialect="duckdb") as conn, conn.cursor() as cur:
        cur.adbc_ingest("docs", DOCS, mode="create")
        cur.adbc_ingest("queries", QUERIES, mode="create")
        cur.adbc_ingest("blanks", pa.table({"id": [1, 2, 3], "body": ["", None, ""]}), mode="create")
        cur.adbc_ingest("short_vectors", pa.table({"id": [1], "e": pa.array([[1.0, 0.0, 0.0]], pa.list_(pa.float32()))}),
                        mode="create")
    return server.uri


def fetch(uri: str, sql: str, dialect: str = "duckdb") -> pa.Table:
    with quail.connect(uri, dialect=dialect) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def vectors(uri: str, texts: list[str | None]) -> np.ndarray:
    """The server's embeddings of the texts, one AI_EMBED each (NaN rows for NULL)."""
    rows = fetch(uri, "SELECT k, AI_EMBED(t) AS e FROM (VALUES " + ", ".join(
        f"({k}, {'NULL' if t is None else repr(t)})" for k, t in enumerate(texts)) + ") v(k, t) ORDER BY k")
    return np.array([e if e is not None else [np.nan] * DIMS for e in rows.column("e").to_pylist()])


def brute_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a @ b.T) / np.outer(np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1))


def test_ai_embed_is_a_fixed_size_list_of_float32(uri):
    table = fetch(uri, "SELECT id, AI_EMBED(body) AS e FROM docs ORDER BY id")
    assert table.schema.field("e").type == pa.list_(pa.float32(), DIMS)
    embedded = table.column("e").to_pylist()
    assert [e is None for e in embedded] == [b is None for b in DOCS.column("body").to_pylist()]
    assert all(abs(np.linalg.norm(e) - 1) < 1e-5 for e in embedded if e is not None)


def test_stored_embeddings_give_the_similarities_recomputed_ones_give(uri):
    with quail.connect(uri, dialect="duckdb") as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE doc_vectors AS SELECT id, AI_EMBED(body) AS v FROM docs")
    stored = fetch(uri, "SELECT d.id, AI_SIMILARITY(v, 'cold food') AS s FROM doc_vectors d ORDER BY id")
    recomputed = fetch(uri, "SELECT id, AI_SIMILARITY(body, 'cold food') AS s FROM docs ORDER BY id")
    assert stored.schema.field("s").type == pa.float64()
    np.testing.assert_allclose(np.array(stored.column("s").to_pylist(), dtype=float),
                               np.array(recomputed.column("s").to_pylist(), dtype=float), atol=1e-6)
    assert fetch(uri, "SELECT typeof(v) AS t FROM doc_vectors LIMIT 1").column("t").to_pylist() == [f"FLOAT[{DIMS}]"]


@pytest.mark.parametrize("dialect", ["duckdb", "snowflake"])
def test_a_view_that_embeds_lists_the_columns_a_read_gives_and_the_same_values(uri, dialect):
    """A view whose query embeds is kept by Quail and expanded where it is read (so its embeddings stop with
    the reading statement): GetTables lists the columns a read returns, named as written, and a read, a
    semantic top-k over it and a view over it give what the same query over the table gives."""
    query = "SELECT id, ai_embed(body), AI_SIMILARITY(body, 'cold food') AS s FROM docs"
    with quail.connect(uri, dialect=dialect) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE VIEW doc_embeddings_{dialect} AS {query}")
        cur.execute(f"CREATE VIEW best_doc_{dialect} AS SELECT id FROM doc_embeddings_{dialect} "
                    "ORDER BY s DESC NULLS LAST, id LIMIT 1")
        listed = conn.adbc_get_table_schema(f"doc_embeddings_{dialect}")
    read = fetch(uri, f"SELECT * FROM doc_embeddings_{dialect} ORDER BY id", dialect)
    direct = fetch(uri, f"{query} ORDER BY id", dialect)
    assert listed.names == read.column_names == ["id", "ai_embed(body)", "s"]
    assert [f.type for f in listed] == read.schema.types == [pa.int64(), pa.list_(pa.float32(), DIMS), pa.float64()]
    assert read.to_pylist() == direct.to_pylist()
    best = fetch(uri, "SELECT id FROM docs ORDER BY AI_SIMILARITY(body, 'cold food') DESC NULLS LAST, id LIMIT 1")
    assert fetch(uri, f"SELECT * FROM best_doc_{dialect}", dialect).to_pylist() == best.to_pylist()
    top = fetch(uri, f"SELECT id FROM doc_embeddings_{dialect} ORDER BY AI_SIMILARITY(\"ai_embed(body)\", 'soup') "
                     "DESC NULLS LAST, id LIMIT 3", dialect)
    assert top.to_pylist() == fetch(uri, "SELECT id FROM docs ORDER BY AI_SIMILARITY(body, 'soup') DESC NULLS LAST, "
                                         "id LIMIT 3").to_pylist()


@pytest.mark.parametrize("dialect, sql", [
    ("duckdb", "SELECT id FROM docs ORDER BY AI_SIMILARITY(body, 'cold food') DESC NULLS LAST, id LIMIT 5"),
    ("snowflake", "SELECT id FROM docs ORDER BY AI_SIMILARITY(body, 'cold food') DESC NULLS LAST, id LIMIT 5"),
    ("bigquery", "SELECT id FROM docs ORDER BY AI.SIMILARITY(content1 => body, content2 => 'cold food') DESC "
                 "NULLS LAST, id LIMIT 5"),
])
def test_semantic_top_k_returns_the_brute_force_top_k(uri, dialect, sql):
    """Ties (the same text, so the same score) broken by id, as the query says."""
    bodies = DOCS.column("body").to_pylist()
    scores = brute_cosine(vectors(uri, bodies), vectors(uri, ["cold food"]))[:, 0]
    ranked = sorted((k for k in range(len(bodies)) if bodies[k] is not None), key=lambda k: (-round(scores[k], 5), k))
    assert fetch(uri, sql, dialect).column("id").to_pylist() == ranked[:5]


def test_a_similarity_join_returns_the_brute_force_pairs(uri):
    bodies, texts = DOCS.column("body").to_pylist(), QUERIES.column("text").to_pylist()
    scores = brute_cosine(vectors(uri, bodies), vectors(uri, texts))
    want = sorted((k, QUERIES.column("qid")[j].as_py()) for k in range(len(bodies)) for j in range(len(texts))
                  if bodies[k] is not None and scores[k, j] > 0.5)
    got = fetch(uri, "SELECT d.id, q.qid FROM docs d JOIN queries q ON AI_SIMILARITY(d.body, q.text) > 0.5 "
                     "ORDER BY 1, 2")
    assert list(zip(*[got.column(c).to_pylist() for c in ("id", "qid")])) == want and want


def test_names_types_and_the_other_spellings(uri):
    snowflake = fetch(uri, "SELECT AI_SIMILARITY('cold soup', 'cold food'), "
                           "AI_EMBED('wordllama-l2-supercat-256', 'x') AS e, AI_EMBED('default', 'x') AS f", "snowflake")
    assert snowflake.schema.names == ["AI_SIMILARITY('cold soup', 'cold food')", "e", "f"]
    assert snowflake.column("e").to_pylist() == snowflake.column("f").to_pylist()
    bigquery = fetch(uri, "SELECT AI.EMBED('x', endpoint => 'text-embedding-005').result AS e, "
                          "AI.SIMILARITY('cold soup', 'cold food') AS s", "bigquery")
    assert bigquery.column("e").to_pylist() == snowflake.column("e").to_pylist()
    assert bigquery.column("s").to_pylist() == snowflake.column(0).to_pylist()
    assert fetch(uri, "SELECT AI_SIMILARITY(NULL, 'x') AS s, AI_EMBED(NULL) AS e").to_pylist() == [{"s": None, "e": None}]


@pytest.mark.parametrize("sql, message", [
    ("SELECT AI_EMBED('another-model', body) FROM docs", "not the embedding model served"),
    ("SELECT AI_SIMILARITY(body) FROM docs", "compares two values"),
    ("SELECT AI_EMBED(body, 'a', 'b') FROM docs", "a text, or a model and a text"),
    ("SELECT s.id, d.id FROM short_vectors s JOIN docs d ON AI_SIMILARITY(s.e, d.body) > 0.1", "as many dimensions"),
    ("SELECT ai_top_pairs([[1.0]], [[1.0]], [1, 2], 3)", "one count per right value and a k of at least 1"),
    ("SELECT ai_similar_pairs([[1.0]], [[1.0, 0.0]], 0.5)", "as many dimensions"),
])
def test_bad_embedding_calls_are_invalid_arguments(uri, sql, message):
    with pytest.raises(adbc_driver_manager.ProgrammingError, match=message) as raised:
        fetch(uri, sql)
    assert raised.value.status_code == adbc_driver_manager.AdbcStatusCode.INVALID_ARGUMENT


def test_the_pairs_functions_called_directly(uri):
    """The rewrite's building blocks, callable in SQL: 1-based positions and each pair's cosine; NULL in, NULL
    out; a side's NULL embedding pairs with a NULL cosine where top k keeps it."""
    got = fetch(uri, "SELECT ai_similar_pairs([[3.0, 4.0], [0.0, 1.0]], [[3.0, 4.0]], 0.9) AS a, "
                     "ai_similar_pairs(NULL, [[1.0]], 0.5) AS b, ai_top_pairs([[1.0, 0.0], NULL], [[1.0, 0.0]], [1], 1) AS c")
    assert got.to_pylist() == [{"a": [{"i": 1, "j": 1, "s": 1.0}], "b": None,
                                "c": [{"i": 1, "j": 1, "s": 1.0}, {"i": 2, "j": 1, "s": None}]}]


@pytest.mark.parametrize("fast, slow", [
    ("SELECT d.id, q.qid, AI_SIMILARITY(q.text, d.body) AS s FROM docs d JOIN queries q "
     "ON AI_SIMILARITY(d.body, q.text) >= 0.4 AND q.qid < 3",
     "SELECT d.id, q.qid, AI_SIMILARITY(q.text, d.body) AS s FROM docs d JOIN queries q "
     "ON (AI_SIMILARITY(d.body, q.text) >= 0.4 OR false) AND q.qid < 3"),
    ("SELECT d.id, q.qid FROM docs d, queries q WHERE 0.4 < AI_SIMILARITY(q.text, d.body)",
     "SELECT d.id, q.qid FROM docs d, queries q WHERE 0.4 < AI_SIMILARITY(q.text, d.body) OR false"),
    ("SELECT d.id, q.qid FROM docs d JOIN queries q ON NOT (AI_SIMILARITY(q.text, d.body) <= 0.4)",
     "SELECT d.id, q.qid FROM docs d JOIN queries q ON NOT (AI_SIMILARITY(q.text, d.body) <= 0.4) OR false"),
    ("SELECT q.qid, d.*, AI_SIMILARITY(d.body, q.text) AS s FROM queries q LEFT JOIN docs d "
     "ON AI_SIMILARITY(d.body, q.text) >= 0.5",
     "SELECT q.qid, d.*, AI_SIMILARITY(d.body, q.text) AS s FROM queries q LEFT JOIN docs d "
     "ON AI_SIMILARITY(d.body, q.text) >= 0.5 OR false"),
    ("SELECT q.qid, d.id FROM queries q RIGHT JOIN docs d ON AI_SIMILARITY(d.body, q.text) > 0.5 AND q.qid > 1",
     "SELECT q.qid, d.id FROM queries q RIGHT JOIN docs d ON (AI_SIMILARITY(d.body, q.text) > 0.5 OR false) "
     "AND q.qid > 1"),
    ("SELECT q.qid, d.id, AI_SIMILARITY(q.text, d.body) AS s FROM queries q FULL JOIN docs d "
     "ON AI_SIMILARITY(d.body, q.text) > 0.6",
     "SELECT q.qid, d.id, AI_SIMILARITY(q.text, d.body) AS s FROM queries q FULL JOIN docs d "
     "ON AI_SIMILARITY(d.body, q.text) > 0.6 OR false"),
])
def test_a_similarity_join_asks_pairs_found_once_and_gives_every_pair_s_rows(uri, fast, slow):
    """The join's condition becomes pairs of distinct values found once (a matrix product of the two sides'
    embeddings, a margin below), the exact condition checked on those alone: the rows the pairwise form
    (under OR, not rewritten) gives, NULL and empty texts included; an outer join's unmatched rows once each
    (a FULL join's of both sides).
    The SELECT's similarities are the pairs' own, equal to the last bit to what the pairwise form computes."""
    assert "ai_similar_pairs" in explained(uri, fast) and "ai_similar_pairs" not in explained(uri, slow)
    assert "ai_cosine" not in explained(uri, fast), "no text of a row embedded again"
    got, want = fetch(uri, fast), fetch(uri, slow)
    rows = sorted((tuple(r.values()) for r in got.to_pylist()), key=repr)
    assert got.schema.names == want.schema.names, "the pairs' column is not among the stars'"
    assert rows and rows == sorted((tuple(r.values()) for r in want.to_pylist()), key=repr)
    if "LEFT" in fast or "RIGHT" in fast:
        assert any(None in row for row in rows), "a kept row that matched nothing, NULL-extended"
    if "FULL" in fast:
        assert any(row[0] is None for row in rows) and any(row[1] is None for row in rows), "each side's, once"


def test_a_full_similarity_join_keeps_a_row_whose_pairs_fall_just_short_once(uri):
    """Stored vectors: b's first row passes with a's second (0.87) and falls 3e-6 short with a's first, within
    the pairs' margin; its second row pairs with nothing. Each comes as often as the pairwise form says."""
    angle = np.arccos(0.5 - 3e-6)
    va = pa.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], pa.list_(pa.float32()))
    vb = pa.array([[np.cos(angle), np.sin(angle)], [0.0, -1.0]], pa.list_(pa.float32()))
    with quail.connect(uri, dialect="duckdb") as conn, conn.cursor() as cur:
        cur.adbc_ingest("full_a", pa.table({"id": [1, 2, 3], "v": va}), mode="replace")
        cur.adbc_ingest("full_b", pa.table({"id": [1, 2], "v": vb}), mode="replace")
    fast = "SELECT a.id AS a, b.id AS b FROM full_a a FULL JOIN full_b b ON AI_SIMILARITY(a.v, b.v) > 0.5"
    assert "ai_similar_pairs" in explained(uri, fast)
    got, want = (sorted((tuple(r.values()) for r in fetch(uri, sql).to_pylist()), key=repr)
                 for sql in (fast, fast + " OR false"))
    assert got == want == sorted([(2, 1), (1, None), (3, None), (None, 2)], key=repr)


@pytest.mark.parametrize("fast, slow", [
    ("SELECT q.qid, b.id FROM queries q JOIN blanks b ON AI_SIMILARITY(q.text, b.body) > 0.1",
     "SELECT q.qid, b.id FROM queries q JOIN blanks b ON AI_SIMILARITY(q.text, b.body) > 0.1 OR false"),
    ("SELECT q.qid, b.id FROM queries q LEFT JOIN blanks b ON AI_SIMILARITY(q.text, b.body) > 0.1",
     "SELECT q.qid, b.id FROM queries q LEFT JOIN blanks b ON AI_SIMILARITY(q.text, b.body) > 0.1 OR false"),
    ("SELECT b.id, q.qid FROM blanks b, queries q QUALIFY ROW_NUMBER() OVER (PARTITION BY b.id "
     "ORDER BY AI_SIMILARITY(b.body, q.text) DESC, q.qid) <= 2",
     "SELECT b.id, q.qid FROM blanks b, queries q WHERE q.qid >= 0 QUALIFY ROW_NUMBER() OVER (PARTITION BY b.id "
     "ORDER BY AI_SIMILARITY(b.body, q.text) DESC, q.qid) <= 2"),
])
def test_a_side_with_no_embedding_at_all_joins_as_the_pairwise_form_does(uri, fast, slow):
    """A table whose texts are all empty or NULL (no vector on its side of the matrix products) gives the
    rows the pairwise form gives: no pair above a threshold, each kept row once, every pair in a top k."""
    assert "_pairs" in explained(uri, fast) and "_pairs" not in explained(uri, slow)
    got, want = (sorted((tuple(r.values()) for r in fetch(uri, sql).to_pylist()), key=repr) for sql in (fast, slow))
    assert got == want


TOP_K = "SELECT q.qid, d.id, AI_SIMILARITY(q.text, d.body) AS s FROM queries q, docs d {where} QUALIFY {rank} OVER (PARTITION BY q.qid ORDER BY " \
        "AI_SIMILARITY(d.body, q.text) DESC{nulls}{ties}) <= 3"


@pytest.mark.parametrize("rank, where, nulls, dialect", [("ROW_NUMBER()", "", "", "duckdb"),
                                                         ("RANK()", "WHERE q.qid > 1", " NULLS FIRST", "duckdb"),
                                                         ("ROW_NUMBER()", "", "", "snowflake")])
def test_top_k_per_row_is_planned_as_a_matrix_product_and_gives_the_brute_force_rows(uri, rank, where, nulls, dialect):
    """QUALIFY's top 3 documents per query: the rows a brute force ranking here gives (NULL and empty texts,
    whose similarity is NULL, first or last as the order says; Snowflake puts NULLs first in a descending
    order; ROW_NUMBER's ties broken by id, RANK's kept), found through the pairs that can rank (`ai_top_pairs`);
    a condition on the documents' side keeps the pairwise plan, with the same rows."""
    sql = TOP_K.format(rank=rank, where=where, nulls=nulls, ties=", d.id" if rank == "ROW_NUMBER()" else "")
    bodies, texts = DOCS.column("body").to_pylist(), QUERIES.column("text").to_pylist()
    scores = np.round(brute_cosine(vectors(uri, bodies), vectors(uri, texts)), 5)
    nulls_first = bool(nulls) or dialect == "snowflake"
    want = []
    for j, qid in enumerate(QUERIES.column("qid").to_pylist()):
        if where and qid <= 1:
            continue
        key = [((np.isnan(scores[k, j]) != nulls_first), -np.nan_to_num(scores[k, j]), k) for k in range(len(bodies))]
        ranked = sorted(range(len(bodies)), key=lambda k: key[k])
        if rank == "RANK()":
            want += [(qid, k) for k in ranked if sum(key[m][:2] < key[k][:2] for m in ranked) < 3]
        else:
            want += [(qid, k) for k in ranked[:3]]
    got = fetch(uri, sql, dialect)
    assert sorted(zip(*[got.column(c).to_pylist() for c in ("qid", "id")])) == sorted(want)
    assert "ai_top_pairs" in explained(uri, sql, dialect)
    pairwise = sql.replace("QUALIFY", ("AND" if where else "WHERE") + " d.id >= 0 QUALIFY")
    assert "ai_top_pairs" not in explained(uri, pairwise, dialect)
    assert sorted(fetch(uri, pairwise, dialect).to_pylist(), key=str) == sorted(got.to_pylist(), key=str)


def explained(uri: str, sql: str, dialect: str = "duckdb") -> str:
    return "\n".join(fetch(uri, "EXPLAIN " + sql, dialect).column(0).to_pylist()).lower()

