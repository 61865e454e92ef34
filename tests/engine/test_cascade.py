"""Model cascades (engine/ai/cascade.py, proxy.py): the recall / precision guarantee holds over seeded runs.

- A fixed answer set (the model's yes per row) and proxies from useless to perfect, fed in as scores:
  over RUNS seeded samples the target is met in at least the confidence share of runs, less a tolerance
  from the binomial spread of that count (a method that keeps its promise fails it with probability < ALPHA).
- Plain thresholding on the sample (no correction) fails the same check.
- The whole cascade on synthetic embeddings: model work never exceeds the table, a row is asked once.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from quail.engine.ai.cascade import Targets, Verdict, binomial_cdf, decide, draw_sample, run
from quail.engine.ai.proxy import auc, fit_logistic
from quail.engine.errors import InvalidArgument

ROWS = 20_000
RUNS = 200
ALPHA = 1e-3  # chance that a method keeping its promise fails the share check
YES = np.random.default_rng(0).random(ROWS) < 0.2  # the model's answers: the exact query's rows


def _proxies() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    noise = rng.standard_normal(ROWS)
    strong = YES + 0.5 * noise
    misleading = strong.copy()
    misleading[np.flatnonzero(~YES)[:300]] = 3.0  # the top scores are all wrong: precision is not monotone
    return {"useless": rng.random(ROWS), "weak": YES + 2.0 * noise, "strong": strong,
            "perfect": YES.astype(float), "misleading": misleading}


PROXIES = _proxies()
MODES = {"recall": dict(recall=0.9), "precision": dict(precision=0.9), "both": dict(recall=0.9, precision=0.9)}


def least_successes(runs: int, share: float) -> int:
    """The pass mark: a method meeting its target in `share` of runs scores below it with probability <= ALPHA."""
    x = 0
    while binomial_cdf(x, runs, share) <= ALPHA:
        x += 1
    return x


def realized(answer: np.ndarray, yes: np.ndarray = YES) -> tuple[float, float]:
    hits = int((answer & yes).sum())
    return hits / int(yes.sum()), hits / max(1, int(answer.sum()))


def met(targets: Targets, answer: np.ndarray) -> bool:
    recall, precision = realized(answer)
    return recall >= (targets.recall or 0.0) and precision >= (targets.precision or 0.0)


def cascade_answer(scores: np.ndarray, targets: Targets, seed: int) -> np.ndarray:
    sample = draw_sample(ROWS, targets, np.random.default_rng(seed))
    return decide(scores, sample, YES[sample.rows], targets).answer(YES)


def naive_answer(scores: np.ndarray, targets: Targets, seed: int) -> np.ndarray:
    """Thresholds where the sample's own recall / precision just reach the targets (one target), no bound."""
    sample = draw_sample(ROWS, targets, np.random.default_rng(seed))
    drawn, drawn_yes = scores[sample.calibration], YES[sample.calibration]
    answer = YES.copy()
    if targets.recall:
        answer &= scores >= np.quantile(drawn[drawn_yes], 1.0 - targets.recall)
    if targets.precision:
        negatives = np.sort(drawn[~drawn_yes])[::-1]
        allowed = int(drawn_yes.sum() * (1.0 - targets.precision) / targets.precision)
        answer |= scores > negatives[allowed]
    answer[sample.rows] = YES[sample.rows]
    return answer


def test_least_successes_is_the_binomial_lower_tail():
    x = least_successes(RUNS, 0.95)
    assert binomial_cdf(x - 1, RUNS, 0.95) <= ALPHA < binomial_cdf(x, RUNS, 0.95)
    assert 175 <= x <= 185  # 190 expected, about 3.1 spreads of sqrt(200 * 0.95 * 0.05) below


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("proxy", PROXIES)
def test_the_target_is_met_in_the_confidence_share_of_runs(proxy, mode):
    targets = Targets(**MODES[mode])
    successes = sum(met(targets, cascade_answer(PROXIES[proxy], targets, seed)) for seed in range(RUNS))
    assert successes >= least_successes(RUNS, targets.confidence), (proxy, mode, successes)


@pytest.mark.parametrize("mode", ["recall", "precision"])
def test_plain_thresholding_on_the_sample_fails_the_check(mode):
    targets = Targets(**MODES[mode])
    answers = [naive_answer(PROXIES["strong"], targets, seed) for seed in range(RUNS)]
    assert sum(met(targets, a) for a in answers) < least_successes(RUNS, targets.confidence)


@pytest.mark.parametrize("options", [dict(recall=0.0), dict(recall=1.5), dict(precision=-0.1),
                                     dict(precision=0.9, confidence=1.0), dict(recall=0.9, confidence=0.0),
                                     dict(recall="0.9"), dict(precision=float("nan")), {}])
def test_bad_targets_are_invalid_arguments(options):
    with pytest.raises(InvalidArgument):
        Targets(**options)


def _cascade(embeddings: np.ndarray, yes: np.ndarray, targets: Targets):
    asked = np.zeros(len(yes), dtype=int)

    def ask(rows: np.ndarray) -> np.ndarray:
        asked[rows] += 1
        return yes[rows]

    answer, report = run(len(yes), targets, ask, lambda rows: embeddings[rows], np.random.default_rng(7))
    assert asked.max() <= 1 and asked.sum() == report.model_rows <= len(yes)
    assert report.accepted + report.rejected + report.asked + report.sample_rows == len(yes)
    return answer, report


def test_a_useless_proxy_sends_almost_every_row_to_the_model():
    rng = np.random.default_rng(3)
    yes = rng.random(10_000) < 0.3
    answer, report = _cascade(rng.standard_normal((10_000, 32)), yes, Targets(recall=0.9, precision=0.9))
    assert report.model_rows >= 0.85 * len(yes) and 0.4 < report.auc < 0.6
    assert min(realized(answer, yes)) >= 0.9


def test_a_perfect_proxy_sends_few_rows():
    rng = np.random.default_rng(4)
    yes = rng.random(10_000) < 0.3
    embeddings = rng.standard_normal((10_000, 32))
    embeddings[:, 0] += np.where(yes, 4.0, -4.0)
    answer, report = _cascade(embeddings, yes, Targets(recall=0.9, precision=0.9))
    assert report.asked < 0.02 * len(yes) and report.auc > 0.99
    assert report.recall_bound >= 0.9 and report.precision_bound == 0.9 and report.lower <= report.upper
    assert min(realized(answer, yes)) >= 0.9


def test_a_recall_of_one_asks_every_row_and_a_small_table_is_labeled_whole():
    yes = np.arange(500) % 3 == 0
    _, report = _cascade(np.zeros((500, 4)), yes, Targets(recall=1.0))
    assert (report.sample_rows, report.asked) == (0, 500)
    sample = draw_sample(500, Targets(precision=0.9), np.random.default_rng(0))
    decision = decide(np.zeros(500), sample, yes[sample.rows], Targets(precision=0.9))
    assert (decision.verdict == Verdict.LABELED).all() and (decision.answer(yes) == yes).all()


def test_logistic_regression_hand_cases():
    no_features = fit_logistic(np.zeros((8, 0)), np.array([1, 0, 0, 0, 1, 0, 0, 0]))
    assert no_features.intercept == pytest.approx(np.log(2 / 6), abs=1e-4)  # the log-odds of the mean
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 256))
    y = (x[:, 0] + 0.5 * rng.standard_normal(300)) > 0
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        proxy = fit_logistic(x, y, penalty=2.0)
        seconds.append(time.perf_counter() - start)
    assert min(seconds) < 0.25  # tens of milliseconds on a busy 2-core machine
    p = 1.0 / (1.0 + np.exp(-proxy.score(x)))
    assert np.abs(x.T @ (p - y) + 2.0 * proxy.weights).max() < 1e-6  # the penalised optimum's gradient
    assert proxy.weights[0] == max(proxy.weights)


def test_auc_hand_cases():
    assert auc(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 0, 1, 1])) == 1.0
    assert auc(np.array([4.0, 3.0, 2.0, 1.0]), np.array([0, 0, 1, 1])) == 0.0
    rng = np.random.default_rng(6)
    scores, labels = rng.integers(0, 5, 200).astype(float), rng.random(200) < 0.4
    pairs = scores[labels][:, None] - scores[~labels][None, :]
    assert auc(scores, labels) == pytest.approx(((pairs > 0) + 0.5 * (pairs == 0)).mean())
