"""A cascade's proxy: L2-regularised logistic regression on row embeddings, fitted with numpy, and its AUC.

- `fit_logistic` runs Newton's method with step halving on the penalised log-loss, each step by
  conjugate gradients (matrix-vector products only): a few hundred rows of 256-dimension embeddings fit
  in milliseconds; the penalty keeps the fit finite when the rows are separable or of one class.
- `fit_one_vs_rest` fits one such regression per category seen among the rows (a classification's proxy):
  its prediction is the category of the highest sigmoid, its confidence that sigmoid over their sum.
- `auc` is the rank statistic (Mann-Whitney U over n1 * n0), tied scores counting one half.
- numpy only: nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

PENALTY = 1.0  # L2 weight on the coefficients, against the log-loss summed over the rows
INTERCEPT_PENALTY = 1e-6  # keeps the intercept finite when every row has one label
NEWTON_STEPS = 50
CG_STEPS = 200  # conjugate-gradient steps at most per Newton step
GRADIENT_TOLERANCE = 1e-9  # stop when every coordinate of the gradient is this small


@dataclass(frozen=True)
class Logistic:
    """A fitted proxy: score = embedding @ weights + intercept (a logit; only its order is used)."""

    weights: np.ndarray
    intercept: float

    def score(self, embeddings: np.ndarray) -> np.ndarray:
        return np.asarray(embeddings, dtype=np.float64) @ self.weights + self.intercept


def _objective(design: np.ndarray, labels: np.ndarray, theta: np.ndarray, ridge: np.ndarray) -> float:
    logits = design @ theta
    return float(np.sum(np.logaddexp(0.0, logits) - labels * logits) + 0.5 * np.sum(ridge * theta * theta))


def _solve(product: Callable[[np.ndarray], np.ndarray], right: np.ndarray) -> np.ndarray:
    """x with product(x) = right, product symmetric positive definite: conjugate gradients."""
    x, residual = np.zeros_like(right), right.copy()
    direction, size = residual.copy(), residual @ residual
    for _ in range(CG_STEPS):
        image = product(direction)
        step = size / (direction @ image)
        x, residual = x + step * direction, residual - step * image
        previous, size = size, residual @ residual
        if size <= 1e-24 * (right @ right):
            break
        direction = residual + (size / previous) * direction
    return x


def fit_logistic(embeddings: np.ndarray, labels: np.ndarray, penalty: float = PENALTY) -> Logistic:
    """The penalised maximum-likelihood fit of P(label) = sigmoid(embedding @ w + b).

    Newton's method, each step solved by conjugate gradients from matrix-vector products only (dense
    solves and matrix products run multi-threaded BLAS, which stalls in a busy process that also runs torch).

    >>> x = np.array([[0.0], [1.0], [2.0], [3.0]])
    >>> proxy = fit_logistic(x, np.array([0, 0, 1, 1]))
    >>> round(float(proxy.weights[0]), 3), round(float(proxy.score(np.array([[1.5]]))[0]), 3)
    (0.958, 0.0)
    """
    x = np.asarray(embeddings, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    design = np.hstack([x, np.ones((len(x), 1))])
    ridge = np.append(np.full(x.shape[1], penalty), INTERCEPT_PENALTY)
    theta = np.zeros(design.shape[1])
    current = _objective(design, y, theta, ridge)
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        gradient = design.T @ (p - y) + ridge * theta
        if np.abs(gradient).max() <= GRADIENT_TOLERANCE:
            break
        curvature = p * (1.0 - p)
        step = _solve(lambda v: design.T @ (curvature * (design @ v)) + ridge * v, gradient)
        size, trial = 1.0, _objective(design, y, theta - step, ridge)
        while trial > current and size > 1e-6:
            size /= 2.0
            trial = _objective(design, y, theta - size * step, ridge)
        if trial > current:
            break
        theta, current = theta - size * step, trial
    return Logistic(theta[:-1], float(theta[-1]))


PREDICTION = np.dtype([("label", np.int32), ("confidence", np.float64)])  # a classification proxy's, per row


@dataclass(frozen=True)
class OneVsRest:
    """A fitted classification proxy: a logistic regression per category seen in its rows, none for the others."""

    labels: np.ndarray  # the categories seen, ascending
    proxies: tuple[Logistic, ...]

    def predict(self, embeddings: np.ndarray) -> np.ndarray:
        """Per row (PREDICTION records) the category of the highest sigmoid, and that sigmoid over their sum.

        The sigmoids normalised (as scikit-learn's one-vs-rest probabilities) rather than a softmax of the
        logits: each is its own regression's probability of its category, so the share is a probability
        over the categories seen. Unseen categories have none: they are never predicted.
        """
        logits = np.stack([proxy.score(embeddings) for proxy in self.proxies], axis=1)
        chance = 1.0 / (1.0 + np.exp(-np.clip(logits, -500.0, 500.0)))
        best = chance.argmax(axis=1)
        out = np.empty(len(logits), PREDICTION)
        out["label"] = self.labels[best]
        out["confidence"] = chance[np.arange(len(logits)), best] / chance.sum(axis=1)
        return out


def fit_one_vs_rest(embeddings: np.ndarray, labels: np.ndarray, penalty: float = PENALTY) -> OneVsRest:
    """A logistic regression (`fit_logistic`) per category among `labels`: that category against the rest.

    >>> x = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]])
    >>> proxy = fit_one_vs_rest(x, np.array([0, 0, 2, 2, 5, 5]))
    >>> [(int(p["label"]), round(float(p["confidence"]), 2)) for p in proxy.predict(np.array([[-3.0], [9.0]]))]
    [(0, 0.75), (5, 0.75)]
    """
    seen = np.unique(np.asarray(labels))
    return OneVsRest(seen, tuple(fit_logistic(embeddings, np.asarray(labels) == label, penalty) for label in seen))


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """P(a positive's score > a negative's), ties counting 1/2; None when either class is missing.

    >>> auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
    0.75
    >>> auc(np.array([1.0, 1.0, 1.0]), np.array([0, 1, 1]))
    0.5
    >>> auc(np.array([0.2, 0.3]), np.array([1, 1])) is None
    True
    """
    s = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(labels).astype(bool)
    n1, n0 = int(positive.sum()), int((~positive).sum())
    if n1 == 0 or n0 == 0:
        return None
    order = np.argsort(s, kind="stable")
    ordered = s[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(s)]
    ranks = np.empty(len(s))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # 1-based mean rank of each tie group
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))
