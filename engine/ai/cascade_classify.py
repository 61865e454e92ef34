"""Model cascades for a classification (AI_CLASSIFY) with an accuracy target: a proxy per category, one threshold.

- Accuracy: the share of rows whose category is the model's for that row (the exact query's), met with
  probability >= confidence over the sampling, whatever the proxy. The sample, its draws and `Known` are a
  filter's (engine/ai/cascade.py): fit rows uniform without replacement, d draws i.i.d. uniform over the N
  rows outside them. The proxy: a logistic regression per category seen among the fit rows, one against
  the rest (engine/ai/proxy.py); it predicts the category of the highest sigmoid, confident by that sigmoid
  over their sum. Any confidence keeps the guarantee (only held-out draws judge it); a good one asks less.
- Rows of confidence >= tau take the proxy's category; every other row is asked (sampled ones already
  are). Sampled and asked rows get the model's answer, so the only errors are rows accepted and wrong:
  it suffices that p(tau), their share among the N rows, is <= eps = 1 - accuracy.
- Threshold: x(tau) = draws accepted and wrong ~ Binomial(d, p(tau)); x* = the most x with
  P(Binomial(d, eps) <= x) <= delta; tau = the lowest row confidence with x(tau) <= x* (just above the
  (x*+1)-th most confident wrong draw; every row when fewer are wrong); no x passes: inf, none accepted.
- Why it holds: p and x both grow as tau falls. Let b be the highest row confidence with p(b) > eps (none:
  nothing can fail). If p(tau) > eps then tau <= b, so x(b) <= x(tau) <= x*; b is fixed and x(b) ~
  Binomial(d, p(b)), so that has probability <= P(Binomial(d, eps) <= x*) <= delta. One fixed threshold
  bounds the chosen one's failure: no multiplicity correction, as for the filter's precision (a top-down
  fixed sequence). Then accuracy over every row >= 1 - p(tau) N / n_rows >= the target.
- Reported bound 1 - U(f), U Clopper-Pearson's upper limit for f wrong of d, f = min(x*, wrong draws)
  (U(x*) <= eps: at least the target). m the lowest confidence: if p(m) > U(x*), a failure puts x(b) <= x*
  for the highest b with p(b) > U(x*), as above; else only tau = m (fixed, f = x(m)) can fail, by at most
  Clopper-Pearson's delta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from quail.engine.ai.cascade import (Accounting, Decided, Decision, Known, Sample, Targets, Verdict, binomial_cdf,
                                     binomial_upper_limit, cascade, threshold_above)
from quail.engine.ai.proxy import PREDICTION, fit_one_vs_rest
from quail.engine.errors import InvalidArgument


def accuracy_threshold(population: np.ndarray, wrong_confidence: np.ndarray, draws: int, accuracy: float,
                       delta: float) -> tuple[float, int]:
    """(tau, f): rows of confidence >= tau take the proxy's category, f the wrong draws allowed at or above.

    `population`: the confidence of the rows the draws come from; `wrong_confidence`: that of the draws whose
    proxy category is not the model's. (inf, -1): nothing accepted.

    >>> accuracy_threshold(np.arange(100.0) / 100, np.array([0.995, 0.5, 0.2]), 100, 0.9, 0.05)
    (0.0, 3)
    >>> accuracy_threshold(np.arange(100.0) / 100, np.arange(20.0) / 20, 100, 0.9, 0.05)
    (0.76, 4)
    """
    return threshold_above(population, wrong_confidence,
                           lambda x: binomial_cdf(x, draws, 1.0 - accuracy) <= delta)


@dataclass(frozen=True)
class ClassifyReport(Accounting):
    """A classification cascade's accounting: sample, the proxy's agreement, threshold, who decided, guarantee.

    The estimate is the draws' (over the rows outside the fit sample); the bound holds with probability >=
    confidence (1.0 where the proxy decided nothing).
    """

    sample_rows: int
    fit_rows: int
    calibration_draws: int
    agreement: float | None  # share of the held-out sampled rows where the proxy's category is the model's
    threshold: float
    accepted: int
    asked: int
    accuracy_estimate: float
    accuracy_bound: float
    confidence: float
    remembered: int = 0  # rows of the sample and the asked ones answered by an earlier cascade (`Known`)

    def describe(self) -> str:
        """The report as EXPLAIN ANALYZE shows it: the sample, the proxy, who decided, what is guaranteed."""
        rows = self.sample_rows + self.accepted + self.asked
        quality = (f"proxy agreement {self.agreement:.3f} on held-out sampled rows" if self.agreement is not None
                   else "no proxy")
        return (self._opening(rows, "the threshold") + f", {self.asked:,} below the threshold; {quality}; "
                f"{self.accepted:,} given the proxy's category from confidence {self.threshold:.4g}; accuracy "
                f"estimated {self.accuracy_estimate:.3f}, at least {self.accuracy_bound:.3f}, "
                f"at confidence {self.confidence:g}" + self._closing())


@dataclass(frozen=True)
class Labeling(Decision):
    """Every row's verdict (ACCEPT: the proxy's category), the proxy's categories, and the accounting."""

    predicted: np.ndarray

    def answer(self, model_labels: np.ndarray) -> np.ndarray:
        """Each row's category: the proxy's where accepted, else the model's (read only where asked or labeled)."""
        return np.where(self.verdict == Verdict.ACCEPT, self.predicted, model_labels)


def decide_labels(predicted: np.ndarray, confidence: np.ndarray, sample: Sample, sample_labels: np.ndarray,
                  targets: Targets) -> Labeling:
    """The threshold and verdicts from the proxy's category and confidence (every row) and the model's
    categories for `sample.rows`."""
    predicted, confidence = np.asarray(predicted), np.asarray(confidence, dtype=np.float64)
    labels = np.full(len(predicted), -1, dtype=np.int64)
    labels[sample.rows] = sample_labels
    outside = np.ones(len(predicted), dtype=bool)
    outside[sample.fit] = False
    drawn, d = sample.calibration, len(sample.calibration)
    wrong = predicted[drawn] != labels[drawn]
    threshold, f = accuracy_threshold(confidence[outside], confidence[drawn][wrong], d, targets.accuracy,
                                      targets.delta)
    verdict = np.where(confidence >= threshold, Verdict.ACCEPT, Verdict.ASK).astype(np.int8)
    verdict[sample.rows] = Verdict.LABELED
    held_out = np.unique(drawn)
    x = int((wrong & (confidence[drawn] >= threshold)).sum())
    report = ClassifyReport(
        sample_rows=len(sample.rows), fit_rows=len(sample.fit), calibration_draws=d,
        agreement=float((predicted[held_out] == labels[held_out]).mean()) if d else None, threshold=threshold,
        accepted=int((verdict == Verdict.ACCEPT).sum()), asked=int((verdict == Verdict.ASK).sum()),
        accuracy_estimate=1.0 - x / d if d else 1.0,
        accuracy_bound=1.0 - binomial_upper_limit(f, d, targets.delta) if threshold < math.inf else 1.0,
        confidence=targets.confidence)
    return Labeling(verdict, report, predicted)


def classify(n_rows: int, n_labels: int, targets: Targets, ask: Callable[[np.ndarray], np.ndarray],
             embed: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
             known: Known | None = None,
             decided: Decided = lambda report: None) -> tuple[np.ndarray, ClassifyReport]:
    """The whole cascade: each row's category index (int32) and the report; `ask` gets each row at most once.

    `ask(rows)` gives the model's category index per row (0 to n_labels - 1, in order); `embed(rows)` their
    embeddings, as for a filter's `run`. `known`: what earlier classifications of the same question over the
    same rows learned (`Known.nothing(n_rows, np.int32)`; updated here), so their rows are not asked again.
    `decided`: told the report (the band not asked yet) once the threshold is set.
    """
    if targets.kind != "classify":
        raise InvalidArgument(f"a classification's cascade takes an accuracy target, not {targets.describe()}")

    def asked(rows: np.ndarray) -> np.ndarray:
        labels = np.asarray(ask(rows))
        if len(labels) != len(rows) or ((labels < 0) | (labels >= n_labels)).any():
            raise ValueError(f"the model's categories must be {len(rows)} indices in [0, {n_labels})")
        return labels

    def decide_with(scores: np.ndarray | None, sample: Sample, answers: np.ndarray) -> Labeling:
        scores = np.zeros(n_rows, PREDICTION) if scores is None else scores
        return decide_labels(scores["label"], scores["confidence"], sample, answers, targets)

    known = known if known is not None else Known.nothing(n_rows, np.int32)
    return cascade(n_rows, targets, asked, embed, rng, known, lambda x, labels: fit_one_vs_rest(x, labels).predict,
                   decide_with, decided)
