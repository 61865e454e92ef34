"""Model cascades with a stated guarantee: a labeled sample, a proxy, thresholds, and only the band asked.

- Targets are relative to the model's own answers on every row (the exact query's): with probability
  >= `confidence` over the sampling, whatever the proxy, the answer's recall (precision) is >= the target.
  Answer = rows at or above the upper threshold + band and sampled rows the model calls yes: recall is lost
  only below the lower threshold, precision only above the upper one.
- A filter's cascade holds both: a target not stated is held to the stated one (recall 0.9 alone keeps
  precision >= 0.9 too, so the proxy may accept as well as reject; state both to set each). Each gets half of
  1 - confidence (union bound), so both hold together with probability >= confidence.
- Sample: `FIT_ROWS` rows (uniform, no replacement) fit the proxy; calibration draws are i.i.d. uniform
  over the other rows, independent of the proxy: thresholds (and the reported AUC) use held-out rows only.
- Lower threshold: the j-th smallest of the k positive draws' scores, j the largest with
  P(Binomial(k, 1 - recall) <= j - 1) <= delta: the order statistic that is an exact lower confidence bound
  of the positives' (1 - recall) quantile (Wilks 1941; David & Nagaraja, Order Statistics, 2003, sec. 7.2).
- Upper threshold: above the (f+1)-th highest negative draw, f the most with P(Binomial(k + f, r) <= f)
  <= delta, r = `false_share`: an exact one-sided test per threshold, its p-value monotone in the
  threshold, so the top-down fixed sequence needs no multiplicity correction (Bauer 1991; Angelopoulos et
  al. 2021, Learn then Test).
- SUPG (Kang et al., VLDB 2020) sets such thresholds from importance-sampled draws with normal-approximation
  (asymptotic) bounds; here uniform draws and exact binomial bounds: valid at any sample size, at the cost
  of more draws when positives are rare. A weak proxy widens the band towards every row; model work is
  the sample plus the band, never more than the table (no row is asked twice).
- Classification (AI_CLASSIFY) with an accuracy target shares the sample, the tests and `Known`:
  engine/ai/cascade_classify.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Callable

import numpy as np

from quail.engine.ai.proxy import auc, fit_logistic
from quail.engine.errors import InvalidArgument

FIT_ROWS = 256  # rows whose embeddings fit the proxy
CALIBRATION_FACTOR = 20  # draws, as a multiple of the fewest an exact test needs to move a threshold at all
EMBED_CHUNK = 4096  # rows embedded and scored at a time


class Verdict(IntEnum):
    """What becomes of a row: decided by the proxy, asked of the model, or already labeled in the sample.

    A classification's proxy decides by ACCEPT (its category is the row's); it never rejects.
    """

    REJECT = 0
    ACCEPT = 1
    ASK = 2
    LABELED = 3


@dataclass(frozen=True)
class Targets:
    """A filter's recall and / or precision, or a classification's accuracy, each met with probability >= confidence.

    One class for both, so that options parse alike and a plan step carries one field; `kind` says which
    operator the targets are for, and a filter's targets never mix with a classification's.
    """

    recall: float | None = None
    precision: float | None = None
    confidence: float = 0.95
    accuracy: float | None = None  # share of rows whose category is the model's (AI_CLASSIFY)

    def __post_init__(self) -> None:
        if self.recall is None and self.precision is None and self.accuracy is None:
            raise InvalidArgument("a cascade needs a recall, a precision or an accuracy target")
        if self.accuracy is not None and (self.recall is not None or self.precision is not None):
            raise InvalidArgument("accuracy is a classification's target, recall and precision a filter's: "
                                  "not both")
        for name, closed in (("recall", True), ("precision", True), ("accuracy", True), ("confidence", False)):
            value = getattr(self, name)
            if value is None and closed:
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and 0.0 < value and (value <= 1.0 if closed else value < 1.0)):
                raise InvalidArgument(f"{name} must be a number in (0, 1{']' if closed else ')'}, got {value!r}")

    def describe(self) -> str:
        """The targets as EXPLAIN shows them, a filter's held one included.

        >>> Targets(recall=0.9).describe(), Targets(recall=0.9, precision=0.8).describe()
        ('recall 0.9 (precision held to 0.9) at confidence 0.95', 'recall 0.9 and precision 0.8 at confidence 0.95')
        """
        given = [(name, value) for name, value in (("recall", self.recall), ("precision", self.precision),
                                                   ("accuracy", self.accuracy)) if value is not None]
        wanted = " and ".join(f"{name} {value:g}" for name, value in given)
        if self.kind == "filter" and len(given) == 1:
            held, value = ("precision", self.recall) if self.precision is None else ("recall", self.precision)
            wanted += f" ({held} held to {value:g})"
        return f"{wanted} at confidence {self.confidence:g}"

    @property
    def held(self) -> tuple[float, ...]:
        """The targets the cascade meets: a filter's (recall, precision), the one not stated held to the other;
        a classification's (accuracy,).

        >>> Targets(precision=0.8).held, Targets(accuracy=0.9).held
        ((0.8, 0.8), (0.9,))
        """
        if self.kind == "classify":
            return (self.accuracy,)
        recall = self.recall if self.recall is not None else self.precision
        return recall, self.precision if self.precision is not None else recall

    @property
    def kind(self) -> str:
        """The AI function kind (engine/ai/kinds.py) the targets are for: "filter" or "classify".

        >>> Targets(accuracy=0.9).kind, Targets(precision=0.8).kind
        ('classify', 'filter')
        """
        return "classify" if self.accuracy is not None else "filter"

    @property
    def delta(self) -> float:
        """Each held target's failure probability: 1 - confidence, halved for a filter's two."""
        return (1.0 - self.confidence) / len(self.held)


def binomial_cdf(x: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= x).

    >>> round(binomial_cdf(0, 29, 0.1), 4)
    0.0471
    >>> binomial_cdf(3, 3, 0.5), binomial_cdf(-1, 3, 0.5)
    (1.0, 0.0)
    """
    if x < 0:
        return 0.0
    if x >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    k = np.arange(x + 1)
    log_pmf = (math.lgamma(n + 1) - np.array([math.lgamma(i + 1) + math.lgamma(n - i + 1) for i in k])
               + k * math.log(p) + (n - k) * math.log1p(-p))
    return float(min(1.0, np.exp(log_pmf).sum()))


def binomial_upper_limit(x: int, n: int, delta: float) -> float:
    """The p with P(Binomial(n, p) <= x) = delta: Clopper-Pearson's one-sided upper bound for x of n.

    >>> round(binomial_upper_limit(0, 29, 0.05), 4)
    0.0981
    """
    if x >= n:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2.0
        low, high = (mid, high) if binomial_cdf(x, n, mid) > delta else (low, mid)
    return high


def calibration_draws(targets: Targets) -> int:
    """CALIBRATION_FACTOR * ln(1/delta) / (1 - target), for the most demanding target below 1.

    ln(1/delta) / (1 - target) positive draws is about the fewest with which an exact test can move a
    threshold at all; twenty times that leaves, at 10% selectivity, twice that many positives. A
    target of 1 is met only by asking every row: no draws for it.

    >>> calibration_draws(Targets(recall=0.9)), calibration_draws(Targets(accuracy=0.9))
    (738, 600)
    """
    needed = [math.log(1.0 / targets.delta) / (1.0 - t) for t in targets.held if t < 1.0]
    return math.ceil(CALIBRATION_FACTOR * max(needed)) if needed else 0


def sample_sizes(n_rows: int, targets: Targets) -> tuple[int, int]:
    """(fit rows, calibration draws); every row labeled, (n_rows, 0), when those would reach the table.

    >>> sample_sizes(100_000, Targets(recall=0.9)), sample_sizes(900, Targets(recall=0.9))
    ((256, 738), (900, 0))
    """
    draws = calibration_draws(targets)
    if draws == 0:
        return 0, 0
    if FIT_ROWS + draws >= n_rows:
        return n_rows, 0
    return FIT_ROWS, draws


@dataclass(frozen=True)
class Sample:
    """Rows the model labels: `fit` (distinct) trains the proxy; `calibration` draws (may repeat) set thresholds."""

    fit: np.ndarray
    calibration: np.ndarray

    @property
    def rows(self) -> np.ndarray:
        """The distinct rows to ask the model about, in order."""
        return np.unique(np.concatenate([self.fit, self.calibration]))


def draw_sample(n_rows: int, targets: Targets, rng: np.random.Generator) -> Sample:
    """Fit rows uniform without replacement; calibration draws i.i.d. uniform over the remaining rows."""
    fit_rows, draws = sample_sizes(n_rows, targets)
    fit = np.sort(rng.choice(n_rows, size=fit_rows, replace=False))
    rest = np.setdiff1d(np.arange(n_rows), fit, assume_unique=True)
    return Sample(fit, rest[rng.integers(0, len(rest), size=draws)] if draws else np.zeros(0, dtype=np.int64))


def largest_passing(passes: Callable[[int], bool], limit: int) -> int:
    """The largest x in [0, limit] with passes(x), for a test that passes up to some x and fails after; -1 if none."""
    low, high = -1, limit
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if passes(mid) else (low, mid - 1)
    return low


def lower_threshold(positive_scores: np.ndarray, recall: float, delta: float) -> tuple[float, int]:
    """(threshold, j): rows scoring below the j-th smallest positive draw are rejected; (-inf, 0) rejects none.

    >>> lower_threshold(np.arange(100.0), 0.9, 0.05)
    (4.0, 5)
    """
    k = len(positive_scores)
    if recall >= 1.0 or k == 0:
        return -math.inf, 0
    j = largest_passing(lambda j: binomial_cdf(j - 1, k, 1.0 - recall) <= delta, k)
    return (float(np.sort(positive_scores)[j - 1]) if j > 0 else -math.inf), max(j, 0)


def false_share(recall: float, precision: float) -> float:
    """The most false rows, as a share of (positives + accepted false rows), that still meet the precision target.

    Precision = kept / (kept + false) and kept >= recall * positives, so
    false <= positives * recall * (1 - precision) / precision suffices.

    >>> round(false_share(1.0, 0.9), 6), round(false_share(0.9, 0.9), 4)
    (0.1, 0.0909)
    """
    ratio = recall * (1.0 - precision) / precision
    return ratio / (1.0 + ratio)


def upper_threshold(population: np.ndarray, positive_draws: int, negative_scores: np.ndarray,
                    share: float, delta: float) -> float:
    """Accept rows scoring above the (f+1)-th highest negative draw, f the most false draws whose test passes.

    Among draws that are positive or a negative above t (i.i.d. over those rows), the false ones are
    Binomial(c, false share); a threshold passes when P(Binomial(c, share) <= false draws) <= delta. That
    p-value grows as t falls, so the top-down fixed sequence over the rows' scores stops at this one.
    inf: nothing accepted.

    >>> upper_threshold(np.arange(10.0), 40, np.array([8.5, 3.5]), 0.1, 0.05)
    9.0
    """
    if share <= 0.0:
        return math.inf
    return threshold_above(population, negative_scores,
                           lambda f: binomial_cdf(f, positive_draws + f, share) <= delta)[0]


def threshold_above(population: np.ndarray, false_scores: np.ndarray,
                    passes: Callable[[int], bool]) -> tuple[float, int]:
    """(t, f): the lowest t among the population's scores with at most f false draws at or above it, f the
    most false draws (at most all of them) that `passes` (monotone: passes up to some f, fails after);
    (inf, -1) when none passes: nothing at or above.

    >>> threshold_above(np.arange(10.0), np.array([8.5, 3.5, 1.0]), lambda f: f <= 1)
    (4.0, 1)
    """
    highest = np.sort(false_scores)[::-1]
    f = largest_passing(passes, len(highest))
    if f < 0:
        return math.inf, f
    if f == len(highest):
        return float(population.min()), f
    above = population[population > highest[f]]
    return (float(above.min()) if len(above) else math.inf), f


class Accounting:
    """What every cascade's report tells alike: the rows the model answered, its figures, its opening words."""

    sample_rows: int
    fit_rows: int
    calibration_draws: int
    asked: int
    remembered: int

    @property
    def model_rows(self) -> int:
        """Rows the model answered for this query: the sample and the band, less those remembered."""
        return self.sample_rows + self.asked - self.remembered

    def figures(self) -> dict[str, float | int | None]:
        """The report's fields, thresholds that decide nothing (infinite) as None: a query's stage in JSON."""
        return {name: None if isinstance(value, float) and math.isinf(value) else value
                for name, value in self.__dict__.items()}

    def _opening(self, rows: int, draws_set: str) -> str:
        return (f"{self.model_rows:,} of {rows:,} rows asked of the model: a sample of {self.sample_rows:,} "
                f"({self.fit_rows:,} fit the proxy, {self.calibration_draws:,} draws set {draws_set})")

    def _closing(self) -> str:
        return (f"; {self.remembered:,} rows' answers and the proxy kept from an earlier query"
                if self.remembered else "")


@dataclass(frozen=True)
class Report(Accounting):
    """A cascade's accounting: sample, proxy quality, thresholds, who decided, estimates and guaranteed bounds.

    Estimates are the calibration draws' (over the rows outside the fit sample); each bound holds, with
    the other, with probability >= confidence (1.0 where nothing was decided by the proxy on that side).
    """

    sample_rows: int
    fit_rows: int
    calibration_draws: int
    auc: float | None
    lower: float
    upper: float
    accepted: int
    rejected: int
    asked: int
    recall_estimate: float
    recall_bound: float
    precision_estimate: float
    precision_bound: float
    confidence: float
    remembered: int = 0  # rows of the sample and the band answered by an earlier cascade (`Known`)

    def describe(self) -> str:
        """The report as EXPLAIN ANALYZE shows it: the sample, the proxy, who decided, what is guaranteed."""
        rows = self.sample_rows + self.accepted + self.rejected + self.asked
        quality = f"proxy AUC {self.auc:.3f} on held-out sampled rows" if self.auc is not None else "no proxy"
        return (self._opening(rows, "the thresholds") + f", {self.asked:,} between the thresholds; {quality}; "
                f"{self.rejected:,} rejected below {self.lower:.4g}, {self.accepted:,} accepted from "
                f"{self.upper:.4g}; recall estimated "
                f"{self.recall_estimate:.3f}, at least {self.recall_bound:.3f}, precision estimated "
                f"{self.precision_estimate:.3f}, at least {self.precision_bound:.3f}, "
                f"at confidence {self.confidence:g}" + self._closing())


@dataclass(frozen=True)
class Decision:
    """Every row's verdict (Verdict codes) and the accounting."""

    verdict: np.ndarray
    report: Report

    def band(self) -> np.ndarray:
        """The rows to ask the model."""
        return np.flatnonzero(self.verdict == Verdict.ASK)

    def answer(self, model_yes: np.ndarray) -> np.ndarray:
        """The answer's rows as a mask, from the model's yes per row (bool or `Known`'s codes; read only
        where asked or labeled)."""
        return (self.verdict == Verdict.ACCEPT) | ((self.verdict >= Verdict.ASK) & (np.asarray(model_yes) == 1))


def decide(scores: np.ndarray, sample: Sample, sample_yes: np.ndarray, targets: Targets) -> Decision:
    """Thresholds and verdicts from the proxy's scores (every row) and the model's yes for `sample.rows`."""
    scores = np.asarray(scores, dtype=np.float64)
    yes = np.zeros(len(scores), dtype=bool)
    yes[sample.rows] = sample_yes
    outside = np.ones(len(scores), dtype=bool)
    outside[sample.fit] = False
    drawn, drawn_yes = scores[sample.calibration], yes[sample.calibration]
    recall, precision = targets.held
    lower, j = lower_threshold(drawn[drawn_yes], recall, targets.delta)
    upper = upper_threshold(scores[outside], int(drawn_yes.sum()), drawn[~drawn_yes],
                            false_share(recall, precision), targets.delta)
    lower = min(lower, upper)  # rows both thresholds would decide are accepted: fewer rejections keep recall
    verdict = np.full(len(scores), Verdict.ASK, dtype=np.int8)
    verdict[scores < lower] = Verdict.REJECT
    verdict[scores >= upper] = Verdict.ACCEPT
    verdict[sample.rows] = Verdict.LABELED
    k, lost = int(drawn_yes.sum()), int((drawn_yes & (drawn < lower)).sum())
    false = int((~drawn_yes & (drawn >= upper)).sum())
    held_out = np.unique(sample.calibration)
    report = Report(
        sample_rows=len(sample.rows), fit_rows=len(sample.fit), calibration_draws=len(sample.calibration),
        auc=auc(scores[held_out], yes[held_out]) if len(held_out) else None, lower=lower, upper=upper,
        accepted=int((verdict == Verdict.ACCEPT).sum()), rejected=int((verdict == Verdict.REJECT).sum()),
        asked=int((verdict == Verdict.ASK).sum()),
        recall_estimate=(k - lost) / k if k else 1.0,
        recall_bound=1.0 - binomial_upper_limit(j - 1, k, targets.delta) if j else 1.0,
        precision_estimate=(k - lost) / (k - lost + false) if k - lost + false else 1.0,
        precision_bound=precision if upper < math.inf else 1.0, confidence=targets.confidence)
    return Decision(verdict, report)


@dataclass
class Known:
    """What cascades of one question over the same rows learned: each row's answer, and the proxy's scores.

    - `answers`: a filter's 1 yes, 0 no, a classification's category index; -1 not asked yet.
    - `scores`: every row's, once a proxy was fitted (None before): a filter's score, a classification's
      PREDICTION record (engine/ai/proxy.py: its category and confidence).
    - The sample is drawn with a seed fixed by the question and the rows, so a later cascade draws the same
      fit rows and reuses the proxy: only rows no earlier cascade asked go to the model.
    """

    answers: np.ndarray
    scores: np.ndarray | None = None

    @classmethod
    def nothing(cls, n_rows: int, dtype: type = np.int8) -> "Known":
        """Nothing known yet: int8 answers for a filter; a classification's need room for its categories."""
        return cls(np.full(n_rows, -1, dtype=dtype))

    def answered(self, ask: Callable[[np.ndarray], np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, int]:
        """The model's answers (codes) for these rows, asking only those not yet answered; and how many were."""
        new = rows[self.answers[rows] < 0]
        if len(new):
            self.answers[new] = np.asarray(ask(new)).astype(self.answers.dtype)
        return self.answers[rows], len(rows) - len(new)

    def scored(self, fit: np.ndarray, fit_answers: np.ndarray, embed: Callable[[np.ndarray], np.ndarray],
               proxy: Callable[[np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]]) -> np.ndarray:
        """Every row's proxy output, `proxy(embeddings, answers)` fitted on the `fit` rows (once)."""
        if self.scores is None:
            predict, n_rows = proxy(embed(fit), fit_answers), len(self.answers)
            self.scores = np.concatenate([predict(embed(np.arange(start, min(n_rows, start + EMBED_CHUNK))))
                                          for start in range(0, n_rows, EMBED_CHUNK)])
        return self.scores


Decide = Callable[[np.ndarray | None, Sample, np.ndarray], Decision]  # (scores or None, sample, its answers)


Decided = Callable[[Accounting], None]  # told the report once the thresholds are set, before the band is asked


def cascade(n_rows: int, targets: Targets, ask: Callable[[np.ndarray], np.ndarray],
            embed: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator, known: Known,
            proxy: Callable[[np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]],
            decide_with: Decide, decided: Decided) -> tuple[np.ndarray, Accounting]:
    """Any cascade's course: ask the sample, fit the proxy (when there are draws), decide (`decided` is told),
    ask the band."""
    sample = draw_sample(n_rows, targets, rng)
    sample_answers, remembered = known.answered(ask, sample.rows)
    scores = None
    if len(sample.calibration):
        scores = known.scored(sample.fit, sample_answers[np.searchsorted(sample.rows, sample.fit)], embed, proxy)
    decision = decide_with(scores, sample, sample_answers)
    decided(replace(decision.report, remembered=remembered))
    answers = np.full(n_rows, -1, dtype=known.answers.dtype)
    answers[sample.rows] = sample_answers
    band = decision.band()
    answers[band], more = known.answered(ask, band)
    return decision.answer(answers), replace(decision.report, remembered=remembered + more)


def run(n_rows: int, targets: Targets, ask: Callable[[np.ndarray], np.ndarray],
        embed: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
        known: Known | None = None, decided: Decided = lambda report: None) -> tuple[np.ndarray, Report]:
    """The whole cascade: the answer's mask over the rows and the report; `ask` gets each row at most once.

    `ask(rows)` gives the model's yes per row (bool, in order); `embed(rows)` their embeddings (rows x dim),
    asked for the fit rows, then for every row in chunks of EMBED_CHUNK. `known`: what earlier cascades of
    the same question over the same rows learned (updated here), so their rows are not asked again.
    `decided`: told the report (the band not asked yet) once the thresholds are set.
    """
    if targets.kind != "filter":
        raise InvalidArgument(f"a filter's cascade takes recall or precision targets, not {targets.describe()}")
    return cascade(n_rows, targets, lambda rows: np.asarray(ask(rows), dtype=bool), embed, rng,
                   known if known is not None else Known.nothing(n_rows),
                   lambda x, answers: fit_logistic(x, answers == 1).score,
                   lambda scores, sample, answers: decide(np.zeros(n_rows) if scores is None else scores, sample,
                                                          answers == 1, targets), decided)
