"""AI_EMBED and AI_SIMILARITY as functions DuckDB runs, registered on a DuckDB database.

- `ai_embed(model, text)`: the text's embedding, FLOAT[dims], from the served embedding model.
- `ai_cosine(a, b)`: the cosine of two FLOAT[] lists, a DOUBLE (NULL where either is; DuckDB's own
  list_cosine_similarity refuses a batch in which a NULL list was cast from a NULL array).
- `ai_similar_pairs(left, right, low)` and `ai_top_pairs(left, right, counts, k)`: over two lists of
  embeddings (a similarity join's two sides, each value once), the 1-based (i, j) positions of the pairs
  whose cosine exceeds `low`, or that can be among each left value's k most similar right rows (each
  right value standing for `counts` rows): blocked matrix products on the embeddings' device
  (similar_pairs.py); each pair with `s`, its cosine exactly as `ai_cosine` gives it (the same function
  over the same lists), so the rewritten join reads it instead of embedding its rows' texts again.
- `ai_embed_for(key, ...)`, `ai_similar_pairs_for(key, ...)` and `ai_top_pairs_for(key, ...)`, what the planner
  writes: the same after the key of the statement's work (`getvariable('quail_work')`, which relational.py
  sets on the statement's connection: query_work.Works), so a cancel or time limit stops an embedding model's
  passes before the next one, and the products within one block.

- The planner spells every dialect's AI_EMBED and AI_SIMILARITY with it (planner/embeddings.py), so an
  embedding may stand wherever DuckDB takes an expression: SELECT, WHERE, ORDER BY ... LIMIT, CREATE
  TABLE AS, UPDATE, views.
- A NULL text gives NULL, and so does a text of no tokens.
- DuckDB hands it a batch of rows at a time (Arrow arrays); a constant text is embedded once.
"""

from __future__ import annotations

from typing import Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from duckdb import sqltypes

from quail.engine.errors import InvalidArgument
from quail.engine.exec.function_names import COSINE, EMBED, PAIRS, STOPPING, TOP_PAIRS
from quail.engine.runtime.embeddings import Embeddings

DIMENSIONS_DIFFER = "AI_SIMILARITY compares embeddings of as many dimensions: these differ"
SCORE_ROWS = 256  # pairs whose cosines are computed at a time, their rows copied into two float64 buffers that stay in cache


def embedding_array(vectors: list[np.ndarray | None], dims: int) -> pa.FixedSizeListArray:
    """The embeddings as a fixed-size list array of float32 (None: a NULL row)."""
    missing = np.array([v is None for v in vectors], dtype=bool)
    flat = np.zeros((len(vectors), dims), dtype=np.float32)
    for i, vector in enumerate(vectors):
        if vector is not None:
            flat[i] = vector
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), dims,
                                             mask=pa.array(missing) if missing.any() else None)


def cosine(first: pa.ListArray | pa.ChunkedArray, second: pa.ListArray | pa.ChunkedArray) -> pa.Array:
    """Each row's cosine of two lists of numbers (NULL where either is NULL or all zeros); InvalidArgument where
    two lists differ in length.

    >>> cosine(pa.array([[1.0, 0.0], None, [3.0, 4.0]]), pa.array([[1.0, 1.0], [1.0, 0.0], [3.0, 4.0]])).to_pylist()
    [0.7071067811865475, None, 1.0]
    """
    first, second = (c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in (first, second))
    out = np.full(len(first), np.nan, dtype=np.float64)
    valid = np.asarray(pc.and_(first.is_valid(), second.is_valid()))
    lengths = np.asarray(first.value_lengths().fill_null(0))
    if not np.array_equal(lengths[valid], np.asarray(second.value_lengths().fill_null(0))[valid]):
        raise InvalidArgument(DIMENSIONS_DIFFER)
    for length in np.unique(lengths[valid & (lengths > 0)]):  # rows of one length at a time: a matrix each
        group = np.flatnonzero(valid & (lengths == length))
        out[group] = row_cosines(*(_matrix(side, group, int(length)) for side in (first, second)))
    return pa.array(out, mask=np.isnan(out))


def _matrix(lists: pa.ListArray, rows: np.ndarray, length: int) -> np.ndarray:
    """The lists at `rows`, each `length` long, as the rows of a float64 matrix (read from the lists' values
    where they lie, a slice where they lie end to end)."""
    starts = np.asarray(lists.offsets)[rows]
    values = np.asarray(lists.values)
    if len(rows) and np.all(np.diff(starts) == length):
        return values[starts[0]:starts[0] + length * len(rows)].reshape(len(rows), length).astype(np.float64)
    return values[starts[:, None] + np.arange(length)].astype(np.float64)


def row_cosines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each row's cosine of two float64 matrices' rows (NaN where either row is all zeros): the one arithmetic
    behind `ai_cosine` and the pairs' scores, so that both give a pair the same value to the last bit.

    >>> row_cosines(np.array([[3.0, 4.0], [0.0, 0.0]]), np.array([[3.0, 4.0], [1.0, 0.0]])).tolist()
    [1.0, nan]
    """
    norms = np.sqrt(_row_dots(x, x)) * np.sqrt(_row_dots(y, y))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, _row_dots(x, y) / norms, np.nan)


def _row_dots(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each row's dot product of two matrices' rows (no temporary the size of either: einsum's own loop)."""
    return np.einsum("ij,ij->i", x, y)


def raw_rows(lists: pa.ListArray) -> np.ndarray:
    """The lists as float32 rows of a matrix (zeros where a list is NULL or empty; Arrow's own buffer where
    none is); InvalidArgument where two differ in length.

    >>> raw_rows(pa.array([[3.0, 4.0], None, []], pa.list_(pa.float32()))).tolist()
    [[3.0, 4.0], [0.0, 0.0], [0.0, 0.0]]
    >>> raw_rows(pa.array([None, []], pa.list_(pa.float32()))).shape
    (2, 0)
    """
    lengths = np.asarray(lists.value_lengths().fill_null(0))
    sizes = np.unique(lengths[lengths > 0])
    if len(sizes) > 1:
        raise InvalidArgument(DIMENSIONS_DIFFER)
    held = np.flatnonzero(lengths > 0)
    if not len(held):
        return np.zeros((len(lists), 0), dtype=np.float32)
    values = np.asarray(lists.flatten(), dtype=np.float32).reshape(len(held), -1)
    if len(held) == len(lists):
        return values
    rows = np.zeros((len(lists), values.shape[1]), dtype=np.float32)
    rows[held] = values
    return rows


def unit_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows scaled to unit length (a copy, float32; all-zero rows stay zeros) and which rows hold a vector.

    >>> m, valid = unit_rows(raw_rows(pa.array([[3.0, 4.0], None, [], [0.0, 1.0]])))
    >>> m.astype(float).round(6).tolist(), valid.tolist()
    ([[0.6, 0.8], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]], [True, False, False, True])
    """
    norms = np.sqrt(_row_dots(rows, rows)).astype(np.float32)
    valid = norms > 0
    return np.divide(rows, norms[:, None], out=np.zeros_like(rows), where=valid[:, None]), valid


def _pairs(left: pa.ListArray, right: pa.ListArray, find) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, cosine) of the pairs `find(left unit rows, left valid, right unit rows, right valid)` gives (0-based
    positions), each pair's cosine by `row_cosines` over its two lists (NaN where either has no vector), in
    blocks of SCORE_ROWS pairs; InvalidArgument where the two sides' embeddings differ in length."""
    x, y = raw_rows(left), raw_rows(right)
    if x.shape[1] and y.shape[1] and x.shape[1] != y.shape[1]:
        raise InvalidArgument(DIMENSIONS_DIFFER)
    width = max(x.shape[1], y.shape[1])  # a side of no vector at all: zero rows as wide as the other's
    x, y = (side if side.shape[1] == width else np.zeros((len(side), width), np.float32) for side in (x, y))
    i, j = find(*unit_rows(x), *unit_rows(y))
    scores = np.empty(len(i))
    wide = [np.empty((SCORE_ROWS, side.shape[1])) for side in (x, y)]  # float64, as ai_cosine computes; reused
    for s in range(0, len(i), SCORE_ROWS):
        k = min(SCORE_ROWS, len(i) - s)
        for side, picks, out in zip((x, y), (i, j), wide):
            out[:k] = side[picks[s:s + k]]
        scores[s:s + k] = row_cosines(wide[0][:k], wide[1][:k])
    return i, j, scores


def _positions(found: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]) -> pa.ListArray:
    """Each row's pairs as a list of STRUCT(i, j, s): 1-based positions in its two sides' lists and the pair's
    cosine (NULL where either side has no vector); None: a NULL row (an argument was NULL)."""
    offsets = np.cumsum([0] + [len(pair[0]) if pair is not None else 0 for pair in found])
    held = [pair for pair in found if pair is not None]
    i, j, scores = (np.concatenate([pair[part] for pair in held]) if held else np.zeros(0) for part in range(3))
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.StructArray.from_arrays(
            [pa.array(i + 1, pa.int64()), pa.array(j + 1, pa.int64()), pa.array(scores, mask=np.isnan(scores))],
            names=["i", "j", "s"]),
        mask=pa.array([pair is None for pair in found]) if len(held) < len(found) else None)


def _held(*columns: pa.Array, row: int) -> bool:
    """Whether no column is NULL at the row (else the pairs' functions give NULL)."""
    return all(column[row].is_valid for column in columns)


def register(con: duckdb.DuckDBPyConnection, embeddings: Embeddings) -> None:
    """`ai_embed(model, text)` over `embeddings`, `ai_cosine(a, b)` and the pairs' functions on the connection's
    database (its cursors see them); ones registered before are replaced."""
    from quail.engine.exec import similar_pairs  # torch, loaded by a server's database, not by the planner

    def embed(models: pa.Array, texts: pa.Array, stop: Callable[[], None]) -> pa.FixedSizeListArray:
        for name in set(models.to_pylist()) - {None}:
            embeddings.check_model(name)
        return embedding_array(embeddings.embed(texts.to_pylist(), stop), embeddings.dims)

    def similar(left: pa.ListArray, right: pa.ListArray, low: pa.Array, stop: Callable[[], None]) -> pa.ListArray:
        return _positions([_pairs(left[r].values, right[r].values, lambda x, _, y, __: similar_pairs.above(
            x, y, low[r].as_py(), embeddings.device, stop)) if _held(left, right, low, row=r) else None
            for r in range(len(left))])

    def top(left: pa.ListArray, right: pa.ListArray, counts: pa.ListArray, k: pa.Array,
            stop: Callable[[], None]) -> pa.ListArray:
        found = []
        for r in range(len(left)):
            if not _held(left, right, counts, k, row=r):
                found.append(None)
                continue
            weights, most = counts[r].values.fill_null(0), k[r].as_py()
            if len(weights) != len(right[r].values) or most < 1:
                raise InvalidArgument(f"{TOP_PAIRS} takes one count per right value and a k of at least 1")
            found.append(_pairs(left[r].values, right[r].values, lambda *sides: similar_pairs.top(
                *sides, np.asarray(weights), most, embeddings.device, stop)))
        return _positions(found)

    def stop_of(keys: pa.Array) -> Callable[[], None]:
        """What stops the statement whose work's key DuckDB passed (none found: nothing)."""
        work = embeddings.works.find(keys[0].as_py() if len(keys) else None)
        return work.check if work is not None else similar_pairs.go_on

    def ai_embed(models: pa.Array, texts: pa.Array) -> pa.FixedSizeListArray:
        return embed(models, texts, similar_pairs.go_on)

    def ai_embed_for(keys: pa.Array, models: pa.Array, texts: pa.Array) -> pa.FixedSizeListArray:
        return embed(models, texts, stop_of(keys))

    def ai_similar_pairs(left: pa.ListArray, right: pa.ListArray, low: pa.Array) -> pa.ListArray:
        return similar(left, right, low, similar_pairs.go_on)

    def ai_top_pairs(left: pa.ListArray, right: pa.ListArray, counts: pa.ListArray, k: pa.Array) -> pa.ListArray:
        return top(left, right, counts, k, similar_pairs.go_on)

    def ai_similar_pairs_for(keys: pa.Array, left: pa.ListArray, right: pa.ListArray, low: pa.Array) -> pa.ListArray:
        return similar(left, right, low, stop_of(keys))

    def ai_top_pairs_for(keys: pa.Array, left: pa.ListArray, right: pa.ListArray, counts: pa.ListArray,
                         k: pa.Array) -> pa.ListArray:
        return top(left, right, counts, k, stop_of(keys))

    floats = duckdb.list_type(sqltypes.FLOAT)
    sides = duckdb.list_type(floats)
    positions = duckdb.list_type(duckdb.struct_type({"i": sqltypes.BIGINT, "j": sqltypes.BIGINT,
                                                     "s": sqltypes.DOUBLE}))
    pairs = [sides, sides, sqltypes.DOUBLE]
    top_pairs = [sides, sides, duckdb.list_type(sqltypes.BIGINT), sqltypes.BIGINT]
    vector = duckdb.array_type(sqltypes.FLOAT, embeddings.dims)
    for name, function, parameters, returns in (
            (EMBED, ai_embed, [sqltypes.VARCHAR, sqltypes.VARCHAR], vector),
            (EMBED + STOPPING, ai_embed_for, [sqltypes.VARCHAR, sqltypes.VARCHAR, sqltypes.VARCHAR], vector),
            (COSINE, cosine, [floats, floats], sqltypes.DOUBLE),
            (PAIRS, ai_similar_pairs, pairs, positions),
            (TOP_PAIRS, ai_top_pairs, top_pairs, positions),
            (PAIRS + STOPPING, ai_similar_pairs_for, [sqltypes.VARCHAR, *pairs], positions),
            (TOP_PAIRS + STOPPING, ai_top_pairs_for, [sqltypes.VARCHAR, *top_pairs], positions)):
        try:
            con.remove_function(name)
        except duckdb.InvalidInputException:
            pass  # none registered yet
        con.create_function(name, function, parameters, returns, type="arrow", null_handling="special")
