"""The embedding benches' figures: the accuracy figures on constructed vectors, and a tiny speed run on the CPU (the
smallest dummy shape: the bench's path, not its model)."""

from __future__ import annotations

import json

import numpy as np

from bench import embedding_speed
from bench.embedding_accuracy import centroid_scores, precision_at_k


def test_centroids_and_neighbours_on_two_separated_classes():
    rng = np.random.default_rng(0)
    fresh = np.arange(40) % 2 == 0
    vectors = rng.normal(size=(40, 8)) * 0.1 + np.where(fresh[:, None], 1.0, -1.0) * np.eye(8)[0]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    assert ((centroid_scores(vectors, fresh, 5, 0) > 0) == fresh).all()
    assert precision_at_k(vectors, fresh, 5) == 1.0
    assert precision_at_k(vectors, np.arange(40) % 4 == 0, 5) < 0.9, "labels that do not follow the vectors"


def test_the_speed_bench_embeds_and_prices_a_tiny_run(tmp_path):
    out = embedding_speed.main(["--model", "dummy:smollm2-135m", "--texts", "6", "--words", "8", "--out", str(tmp_path)])
    doc = json.loads(out.read_text())
    assert doc["texts"] == 6 and doc["dims"] == 576 and doc["embeddings_per_s"] > 0
    assert doc["forward_passes"] >= 1 and doc["sol_device"] == "cpu" and doc["sol_s"] > 0


def test_the_query_bench_agrees_with_numpy_on_a_tiny_run(tmp_path):
    from bench import embedding_queries

    doc = json.loads(embedding_queries.main(["--rows", "60", "--left", "12", "--right", "6",
                                             "--out", str(tmp_path)]).read_text())
    assert doc["top_k"]["agree"] and doc["join"]["agree"] and doc["top_k_per_row"]["agree"]
    assert doc["join"]["pairs_compared"] == 72 and doc["top_k"]["warm_s"] > 0
    assert doc["top_k_per_row"]["rows"] == 12 * 5 and doc["join"]["pairs_found"] >= 1
