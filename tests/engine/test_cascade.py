"""Model cascades (engine/ai/cascade.py, proxy.py): the recall / precision guarantee holds over seeded runs.

- A fixed answer set (the model's yes per row) and proxies from useless to perfect, fed in as scores:
  over RUNS seeded samples the target is met in at least the confidence share of runs, less a tolerance
  from the binomial spread of that count (a method that keeps its promise fails it with probability < ALPHA).
- Plain thresholding on the sample (no correction) fails the same check.
- The whole cascade on synthetic embeddings: model work never exceeds the table, a row is asked once.
- The same for a classification's accuracy target (engine/ai/cascade_classify.py): fixed model categories,
  proxies fed in as (category, confidence) per row, and the whole cascade with `Known` reused.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from quail.engine.ai.cascade import Known, Targets, Verdict, binomial_cdf, decide, draw_sample, run, threshold_above
from quail.engine.ai.cascade_classify import classify, decide_labels
from quail.engine.ai.proxy import auc, fit_logistic, fit_one_vs_rest
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
MODES = {"recall": dict(recall=0.9), "precision": dict(precision=0.8), "both": dict(recall=0.95, precision=0.7)}


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
    """Both held targets met: a target not stated is held to the stated one."""
    recall, precision = realized(answer)
    held_recall, held_precision = targets.held
    return recall >= held_recall and precision >= held_precision


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

    told = []  # (the report as `decided` was told it, the rows asked by then)
    answer, report = run(len(yes), targets, ask, lambda rows: embeddings[rows], np.random.default_rng(7),
                         decided=lambda early: told.append((early, int(asked.sum()))))
    assert asked.max() <= 1 and asked.sum() == report.model_rows <= len(yes)
    assert report.accepted + report.rejected + report.asked + report.sample_rows == len(yes)
    assert told == [(report, report.sample_rows)], "told once, the thresholds set and the band not asked yet"
    return answer, report


def test_a_useless_proxy_sends_almost_every_row_to_the_model():
    rng = np.random.default_rng(3)
    yes = rng.random(10_000) < 0.3
    answer, report = _cascade(rng.standard_normal((10_000, 32)), yes, Targets(recall=0.9, precision=0.9))
    assert report.model_rows >= 0.85 * len(yes) and 0.4 < report.auc < 0.6
    assert min(realized(answer, yes)) >= 0.9


@pytest.mark.parametrize("targets", [Targets(recall=0.9, precision=0.9), Targets(recall=0.9)])
def test_a_perfect_proxy_sends_few_rows_and_decides_both_ways(targets):
    """A recall target alone holds precision to it: the proxy accepts rows as well as rejects them."""
    rng = np.random.default_rng(4)
    yes = rng.random(10_000) < 0.3
    embeddings = rng.standard_normal((10_000, 32))
    embeddings[:, 0] += np.where(yes, 4.0, -4.0)
    answer, report = _cascade(embeddings, yes, targets)
    assert report.asked < 0.02 * len(yes) and report.auc > 0.99 and report.accepted > 0.2 * len(yes)
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


LABELS = 4
MODEL = np.random.default_rng(10).choice(LABELS, ROWS, p=[0.4, 0.3, 0.2, 0.1])  # the model's category per row
ACCURACY = Targets(accuracy=0.9)


def _classifiers() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(category, confidence) per row: right where `right`, confidence higher there by `spread` (logits)."""
    rng = np.random.default_rng(11)
    wrong = (MODEL + rng.integers(1, LABELS, ROWS)) % LABELS

    def proxy(right_share: float, spread: float) -> tuple[np.ndarray, np.ndarray]:
        right = rng.random(ROWS) < right_share
        logits = spread * (right - 0.5) + rng.standard_normal(ROWS)
        return np.where(right, MODEL, wrong), 1.0 / (1.0 + np.exp(-logits))

    misleading = proxy(0.8, 3.0)
    misleading[0][:300], misleading[1][:300] = wrong[:300], 1.0  # the most confident are all wrong
    return {"useless": (rng.integers(0, LABELS, ROWS), rng.random(ROWS)), "weak": proxy(0.6, 1.0),
            "strong": proxy(0.8, 3.0), "at the target": proxy(0.9, 0.0), "misleading": misleading,
            "perfect": (MODEL.copy(), np.ones(ROWS))}


CLASSIFIERS = _classifiers()


def classified(proxy: str, seed: int, naive: bool = False) -> np.ndarray:
    """Each row's category by the cascade; `naive`: the lowest threshold whose draws' error share is within
    1 - accuracy (no bound)."""
    predicted, confidence = CLASSIFIERS[proxy]
    sample = draw_sample(ROWS, ACCURACY, np.random.default_rng(seed))
    if not naive:
        return decide_labels(predicted, confidence, sample, MODEL[sample.rows], ACCURACY).answer(MODEL)
    drawn = sample.calibration
    outside = np.setdiff1d(np.arange(ROWS), sample.fit)
    wrong = confidence[drawn][predicted[drawn] != MODEL[drawn]]
    tau, _ = threshold_above(confidence[outside], wrong, lambda x: x <= (1.0 - ACCURACY.accuracy) * len(drawn))
    accepted = confidence >= tau
    accepted[sample.rows] = False
    return np.where(accepted, predicted, MODEL)


@pytest.mark.parametrize("proxy", CLASSIFIERS)
def test_the_accuracy_target_is_met_in_the_confidence_share_of_runs(proxy):
    successes = sum((classified(proxy, seed) == MODEL).mean() >= ACCURACY.accuracy for seed in range(RUNS))
    assert successes >= least_successes(RUNS, ACCURACY.confidence), (proxy, successes)


def test_plain_thresholding_on_the_draws_misses_the_accuracy_target():
    successes = sum((classified("strong", seed, naive=True) == MODEL).mean() >= ACCURACY.accuracy
                    for seed in range(RUNS))
    assert successes < least_successes(RUNS, ACCURACY.confidence)


@pytest.mark.parametrize("options", [dict(accuracy=0.0), dict(accuracy=1.5), dict(accuracy=-0.1),
                                     dict(accuracy="0.9"), dict(accuracy=float("nan")), dict(accuracy=True),
                                     dict(accuracy=0.9, confidence=1.0), dict(accuracy=0.9, recall=0.9),
                                     dict(accuracy=0.9, precision=0.9)])
def test_bad_accuracy_targets_are_invalid_arguments(options):
    with pytest.raises(InvalidArgument):
        Targets(**options)


def test_targets_say_which_cascade_they_are_for():
    assert (Targets(accuracy=0.9).kind, Targets(recall=0.9, precision=0.8).kind) == ("classify", "filter")
    assert Targets(accuracy=0.9).describe() == "accuracy 0.9 at confidence 0.95"
    with pytest.raises(InvalidArgument):
        classify(10, 2, Targets(recall=0.9), lambda rows: rows % 2, lambda rows: np.zeros((len(rows), 1)),
                 np.random.default_rng(0))
    with pytest.raises(InvalidArgument):
        run(10, ACCURACY, lambda rows: rows % 2 == 0, lambda rows: np.zeros((len(rows), 1)), np.random.default_rng(0))


def _classify(embeddings: np.ndarray, labels: np.ndarray, targets: Targets = ACCURACY, known: Known | None = None):
    asked = np.zeros(len(labels), dtype=int)

    def ask(rows: np.ndarray) -> np.ndarray:
        asked[rows] += 1
        return labels[rows]

    answer, report = classify(len(labels), LABELS, targets, ask, lambda rows: embeddings[rows],
                              np.random.default_rng(7), known)
    assert asked.max() <= 1 and asked.sum() == report.model_rows <= len(labels)
    assert report.accepted + report.asked + report.sample_rows == len(labels)
    assert (answer == labels).mean() >= targets.accuracy and report.accuracy_bound >= targets.accuracy
    return answer, report


def test_a_useless_classifier_sends_almost_every_row_to_the_model():
    rng = np.random.default_rng(12)
    labels = rng.integers(0, LABELS, 10_000)
    _, report = _classify(rng.standard_normal((10_000, 32)), labels)
    assert report.model_rows >= 0.85 * len(labels) and report.agreement < 0.35
    assert "proxy agreement" in report.describe() and report.figures()["accuracy_bound"] == report.accuracy_bound


def _separated(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    embeddings = rng.standard_normal((len(labels), 32))
    embeddings[np.arange(len(labels)), labels] += 6.0
    return embeddings


def test_a_perfect_classifier_sends_few_rows_and_known_answers_are_not_asked_again():
    rng = np.random.default_rng(13)
    labels = rng.choice(LABELS, 10_000, p=[0.4, 0.3, 0.2, 0.1])
    embeddings, known = _separated(rng, labels), Known.nothing(len(labels), np.int32)
    answer, report = _classify(embeddings, labels, known=known)
    assert report.asked < 0.02 * len(labels) and report.agreement > 0.99 and report.remembered == 0
    again, repeated = _classify(embeddings, labels, known=known)
    assert repeated.model_rows == 0 and repeated.remembered == report.sample_rows + report.asked
    assert (again == answer).all() and repeated.threshold == report.threshold


def test_an_accuracy_of_one_asks_every_row_and_a_small_table_is_labeled_whole():
    rng = np.random.default_rng(14)
    labels = rng.integers(0, LABELS, 500)
    _, report = _classify(np.zeros((500, 4)), labels, Targets(accuracy=1.0))
    assert (report.sample_rows, report.asked, report.accuracy_bound) == (0, 500, 1.0)
    sample = draw_sample(500, ACCURACY, np.random.default_rng(0))
    labeling = decide_labels(np.zeros(500, int), np.ones(500), sample, labels[sample.rows], ACCURACY)
    assert (labeling.verdict == Verdict.LABELED).all() and (labeling.answer(labels) == labels).all()


def test_one_vs_rest_never_predicts_an_unseen_category():
    rng = np.random.default_rng(15)
    labels = rng.choice([0, 2, 3], 300)
    proxy = fit_one_vs_rest(_separated(rng, labels), labels)
    predicted = proxy.predict(_separated(rng, np.arange(400) % LABELS))
    assert set(predicted["label"]) <= {0, 2, 3}
    assert ((predicted["confidence"] > 0) & (predicted["confidence"] <= 1)).all()
