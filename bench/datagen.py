"""Deterministic corpora for the benchmark (BENCHMARK.md): reviews, reports, claims, traces.

Text is English-like prose from small domain vocabularies, so a real tokenizer
eats it at about the token counts bench/BENCHMARK.md names. `scale` multiplies row
counts (aspects stay 12); `length_scale` multiplies text lengths (1.0 = the
means in bench/BENCHMARK.md), for quick runs on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

SUBJECTS = {
    "reviews": ["the food", "our waiter", "the pasta", "the dessert", "the room", "the staff", "the price",
                "the music", "the wine list", "the terrace", "the booking", "the manager", "the coffee",
                "the portion", "the menu", "the bill", "the parking", "the view", "the bread", "the soup"],
    "reports": ["the patient", "the dose", "the infusion", "the liver panel", "the rash", "the headache",
                "the blood pressure", "the follow-up visit", "the nurse", "the second cycle", "the biopsy",
                "the heart rate", "the lab result", "the nausea", "the treatment", "the renal function"],
    "claims": ["the policy", "the study", "the vaccine", "the new tax", "the bridge", "the river",
               "the election", "the company", "the trial", "the school budget", "the city council"],
    "traces": ["the agent", "the tool call", "the search result", "the file", "the test suite", "the query",
               "the API response", "the plan", "the error message", "the patch", "the build"],
}
VERBS = ["was", "seemed", "became", "remained", "looked", "felt", "turned out", "appeared", "stayed", "proved"]
ADJECTIVES = ["excellent", "slow", "cold", "friendly", "expensive", "clean", "noisy", "perfect", "late", "generous",
              "disappointing", "careful", "unusual", "stable", "elevated", "normal", "wrong", "correct", "broken",
              "reliable", "confusing", "quick", "bland", "warm", "severe", "mild", "accurate", "incomplete"]
CONNECTORS = ["and", "but", "although", "because", "while", "so", "even though", "since"]
CLAUSES = ["we waited for a long time", "nobody explained why", "it matched the description",
           "the schedule changed twice", "everyone agreed afterwards", "the numbers were checked again",
           "the result was written down", "it happened on a Tuesday", "the team had warned us",
           "the second attempt went better", "it cost more than expected", "the notes mention it"]
ASPECTS = ["the quality and taste of the food", "how friendly the staff were", "how fast the service was",
           "the prices and the value for money", "how clean the place was", "the noise level in the room",
           "the choice of wine and drinks", "the location and the parking", "the size of the portions",
           "the desserts and the coffee", "the decor and the atmosphere", "how easy the booking was"]
DRUGS = ["atorvastatin", "metformin", "lisinopril", "amlodipine", "omeprazole", "sertraline", "warfarin",
         "ibuprofen", "prednisone", "gabapentin", "cisplatin", "rituximab"]
TOPICS = ["health", "economy", "climate", "education", "transport", "elections", "technology", "housing"]
TERM_WORDS = ["hepatic", "renal", "cardiac", "dermal", "neural", "gastric", "acute", "chronic", "severe", "mild",
              "injury", "failure", "rash", "arrhythmia", "toxicity", "reaction", "pain", "swelling", "fatigue"]
TERM_SITES = ["of the liver", "in the chest", "after the infusion", "of the skin", "at night", "in the legs"]


def _sentence(rng: np.random.Generator, domain: str) -> str:
    subject = SUBJECTS[domain][rng.integers(len(SUBJECTS[domain]))]
    text = f"{subject.capitalize()} {VERBS[rng.integers(len(VERBS))]} {ADJECTIVES[rng.integers(len(ADJECTIVES))]}"
    if rng.random() < 0.6:
        text += f" {CONNECTORS[rng.integers(len(CONNECTORS))]} {CLAUSES[rng.integers(len(CLAUSES))]}"
    return text + "."


def prose(rng: np.random.Generator, domain: str, tokens: float) -> str:
    """About `tokens` tokens of sentences (≈ 8.5 tokens per sentence)."""
    return " ".join(_sentence(rng, domain) for _ in range(max(1, round(tokens / 8.5))))


def _lengths(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    """Lognormal lengths with the given mean (sigma 0.4: a realistic spread)."""
    sigma = 0.4
    return rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n)


@dataclass(frozen=True)
class Workload:
    """The generation parameters, recorded in every result file."""

    scale: float
    seed: int = 0
    length_scale: float = 1.0

    def rows(self, at_scale_one: int) -> int:
        return max(2, round(at_scale_one * self.scale))


def reviews(w: Workload) -> dict[str, pa.Table]:
    rng = np.random.default_rng([w.seed, 1])
    n = w.rows(50_000)
    bodies = [prose(rng, "reviews", t) for t in _lengths(rng, n, 300 * w.length_scale)]
    return {
        "reviews": pa.table({"id": np.arange(n), "body": bodies, "stars": rng.integers(1, 6, n)}),
        "aspects": pa.table({"id": np.arange(len(ASPECTS)), "aspect": ASPECTS}),
    }


def numbered_reviews(count: int, tokens: float, seed: int = 0) -> pa.Table:
    """`count` reviews of about `tokens` tokens each, each opening with its number ("Review 7: ..."), so no
    two share more than those first words: a workload's statements find nothing of another's cached."""
    rng = np.random.default_rng([seed, 5])
    return pa.table({"id": np.arange(count),
                     "body": [f"Review {i}: " + prose(rng, "reviews", tokens) for i in range(count)]})


def reports(w: Workload) -> dict[str, pa.Table]:
    rng = np.random.default_rng([w.seed, 2])
    n, m = w.rows(5_000), w.rows(4_144)
    texts = [prose(rng, "reports", t) for t in _lengths(rng, n, 2_500 * w.length_scale)]
    terms = [f"{TERM_WORDS[rng.integers(10)]} {TERM_WORDS[10 + rng.integers(9)]} {TERM_SITES[rng.integers(6)]}"
             for _ in range(m)]
    return {
        "reports": pa.table({"id": np.arange(n), "text": texts, "drug": [DRUGS[i] for i in rng.integers(0, len(DRUGS), n)]}),
        "terms": pa.table({"id": np.arange(m), "term": terms}),
    }


def claims(w: Workload) -> dict[str, pa.Table]:
    rng = np.random.default_rng([w.seed, 3])
    n, m = w.rows(5_000), w.rows(1_478)
    return {
        "claims": pa.table({"id": np.arange(n),
                            "claim": [prose(rng, "claims", t) for t in _lengths(rng, n, 25 * w.length_scale)]}),
        "evidence": pa.table({"id": np.arange(m),
                              "passage": [prose(rng, "claims", t) for t in _lengths(rng, m, 150 * w.length_scale)],
                              "topic": [TOPICS[i] for i in rng.integers(0, len(TOPICS), m)]}),
    }


def traces(w: Workload) -> dict[str, pa.Table]:
    """Agent traces: a system prompt shared by all, a task description, then one step per row.

    Row s of a task holds the history up to step s, so the rows of a task share
    ever longer prefixes (mean ≈ 4,000 tokens at length_scale 1).
    """
    rng = np.random.default_rng([w.seed, 4])
    n = w.rows(17_711)
    system = "You are a careful software agent. " + prose(rng, "traces", 1_000 * w.length_scale)
    ids, tasks, steps, histories = [], [], [], []
    task = 0
    while len(ids) < n:
        history = f"{system}\n\nTask {task}: " + prose(rng, "traces", 200 * w.length_scale)
        for step in range(int(rng.integers(4, 17))):
            if len(ids) == n:
                break
            history += f"\n\nStep {step}: " + prose(rng, "traces", 380 * w.length_scale)
            ids.append(len(ids))
            tasks.append(task)
            steps.append(step)
            histories.append(history)
        task += 1
    return {"traces": pa.table({"id": ids, "task_id": tasks, "step": steps, "history": histories})}


CORPORA = {"reviews": reviews, "reports": reports, "claims": claims, "traces": traces}


def generate(w: Workload, corpora: list[str] | None = None) -> dict[str, pa.Table]:
    """All tables of the named corpora (default: all four)."""
    tables: dict[str, pa.Table] = {}
    for name in corpora or list(CORPORA):
        tables.update(CORPORA[name](w))
    return tables
