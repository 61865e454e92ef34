"""The engine's SmolLM2 (GGUF, our loader and decoder) against HF transformers on the same token ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quail.engine.ai.asking import Question, build_requests
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime

TEXTS = [
    "Great food.",
    "The pasta was cold and the waiter was rude.",
    "I loved it!!! 10/10 would come again :)",
    "Meh.",
    "The plot dragged in the middle, but the final twist made up for it: the detective was the narrator all along.",
    "Shipping took 3 weeks (21 days!) and the package was damaged; customer support answered within 2 hours though.",
    "Das Essen war ausgezeichnet, der Service leider langsam.",
    "Numbers: 3.14159, 2.71828, 1.41421 and 1234567890.",
    " ".join(["The room was clean and the staff were kind."] * 6),
    "A review with\nseveral\nlines\n\nand blank ones.",
    " ".join(f"Sentence {i} says something about the battery life of this phone." for i in range(6)),
    "🎉 emoji, ünïcödé, and <|im_start|> inside user text.",
]
TEMPLATES = ["Is {0} a positive review?", "Does {0} mention food?", "Is {0} written in English?"]


@pytest.fixture(scope="module")
def requests(runtime):
    """Three questions per text: several suffixes share each [preamble][document] anchor."""
    reqs = [r for t in TEMPLATES for r in build_requests(runtime, Question(t), [[x] for x in TEXTS])]
    lengths = [len(r) for r in reqs]
    assert len(reqs) >= 20 and max(lengths) > 2 * min(lengths), "≥ 20 prompts of mixed lengths"
    return reqs


@pytest.fixture(scope="module")
def hf_probabilities(hf_p_yes, requests):
    return np.array([hf_p_yes(r) for r in requests])


def test_tokenizer_matches_hf(runtime, hf_tokenizer):
    samples = TEXTS + [runtime.layout.preamble(), runtime.layout.question(TEMPLATES[0]), runtime.layout.answer_cue()]
    for text in samples:
        assert runtime.tokenizer.encode(text).tolist() == hf_tokenizer(text, add_special_tokens=False).input_ids


def test_weights_match_hf_dequantization(runtime, hf_model):
    ours = runtime.runner.model.state_dict()
    theirs = hf_model.model.state_dict()
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


@pytest.mark.parametrize("strategy, token_budget", [
    ("naive", 1), ("naive", 4096), ("quail", 64), ("quail", 4096), ("prefix", 4096),
], ids=["naive-unbatched", "naive-batched", "shared-prefix-chunked", "shared-prefix-batched", "block-prefix"])
def test_true_probability_matches_hf(runtime, requests, hf_probabilities, strategy, token_budget):
    """Every strategy's answers equal HF's; quail's with a budget of 64 computes prompts (up to ~150
    tokens) in chunks of at most 64 tokens, each continuing the KV of the chunk before. The naive strategy,
    which shares nothing between prompts, is asked one question per text (every text, every length): alone,
    a pass a request, and batched, all in one pass."""
    asked = requests[:len(TEXTS)] if strategy == "naive" else requests
    work = QueryWork()
    stats = work.stats
    ours = np.exp(np.array([row[1] for row in runtime.variant(strategy, token_budget).score(asked, work)]))
    assert np.abs(ours - hf_probabilities[:len(asked)]).max() <= 1e-4
    assert ((ours > 0.5) == (hf_probabilities[:len(asked)] > 0.5)).all()
    if strategy == "quail":
        assert stats.cached_tokens > 0 and stats.fresh_tokens < stats.logical_tokens, "shared anchors computed once"


@pytest.mark.parametrize("token_budget", [64, 4096], ids=["chunked", "batched"])
def test_documents_cached_by_one_step_serve_the_next_as_hf_computes_it(runtime, requests, hf_probabilities,
                                                                       hf_p_yes, token_budget):
    """One question per step: the second and third steps continue each document's resident KV (filters),
    and a join anchored on the same documents does too, and the first step sent again computes only each
    prompt's answer cue (its last segment); every answer equals HF's over the full prompt."""
    quail = runtime.variant("quail", token_budget)
    steps = [requests[i * len(TEXTS):(i + 1) * len(TEXTS)] for i in range(len(TEMPLATES))]
    ours, fresh = [], []
    for step in steps:
        work = QueryWork()
        ours += [row[1] for row in quail.score(step, work)]
        fresh.append(work.stats.fresh_tokens)
    assert np.abs(np.exp(ours) - hf_probabilities).max() <= 1e-4
    documents = sum(r.prefix(2)[0] for r in steps[0])
    for step, computed in zip(steps[1:], fresh[1:]):
        assert computed <= sum(len(r) for r in step) - documents, "later steps compute only their questions"
    join = build_requests(runtime, Question("Does {0} answer {1}?", "join"), [[t, "Is it good?"] for t in TEXTS])
    work = QueryWork()
    joined = np.exp([row[1] for row in quail.score(join, work)])
    assert work.stats.fresh_tokens <= sum(len(r) for r in join) - documents, "the anchors were resident"
    assert np.abs(joined - np.array([hf_p_yes(r) for r in join])).max() <= 1e-4
    work = QueryWork()
    again = np.exp([row[1] for row in quail.score(steps[0], work)])
    assert work.stats.fresh_tokens == sum(len(r.segments[-1]) for r in steps[0]), "a refresh: the answer cues"
    assert np.abs(again - hf_probabilities[:len(steps[0])]).max() <= 1e-4


def test_label_tokens_are_yes_and_no(runtime):
    labels = runtime.yes_no
    spelled = {runtime.tokenizer.decode([t]).strip().lower() for t in labels.token_ids}
    assert spelled == {"yes", "no"}
    assert len(labels.token_ids) == 8


def test_categories_answered_by_name_match_hf(runtime, hf_model):
    """AI_CLASSIFY by name: each name's probability, constrained to the names token by token, as HF
    computes it over the full prompt + name; names sharing first tokens branch deeper in the trie."""
    from quail.engine.ai.labels import branches
    from quail.engine.ai.classify import _ask_by_name, classify

    names = ("the food", "the price", "the service", "noise")
    question = Question("What is {0} mostly about?", labels=names, answers="names")
    texts = TEXTS[:2]
    spelled = [list(runtime.tokenizer.encode(n)) for n in names]
    found = branches(spelled)
    assert [len(b.path) for b in found] == [0, 1], "the root parts 'the …' from 'noise'; 'the' branches again"
    got = classify(runtime, question, [texts], QueryWork())
    _, _, ours = _ask_by_name(runtime, question, [texts], QueryWork())
    for text, chosen, mine in zip(texts, got, ours):
        (prompt,) = build_requests(runtime, question, [[text]])
        scores = np.zeros(len(names))
        for n, ids in enumerate(spelled):
            full = torch.tensor(np.concatenate([prompt.ids(), ids]), dtype=torch.long)[None]
            with torch.no_grad():
                logits = hf_model(full).logits[0].float()
            for branch in found:
                if tuple(ids[: len(branch.path)]) == branch.path and ids[len(branch.path)] in branch.ways:
                    ways = list(branch.ways)
                    step = torch.log_softmax(logits[len(prompt) + len(branch.path) - 1, ways], -1)
                    scores[n] += float(step[ways.index(ids[len(branch.path)])])
        np.testing.assert_allclose(mine, scores, atol=1e-4)
        assert chosen == names[int(np.argmax(scores))]


def test_documents_the_pool_has_no_room_for_come_back_from_host_memory_as_hf_computes_them(runtime, requests,
                                                                                            hf_probabilities):
    """A pool of 320 tokens under documents of about 830, and host memory for all: the documents the pool
    lets go of move to the host tier, later steps and a refresh copy them back instead of computing them,
    and every answer still equals HF's."""
    per_token = runtime.runner.pool.bytes_per_token
    small = Runtime(runtime.model_id, runtime.runner.model, runtime.tokenizer, runtime.layout.frame, "quail", 256,
                    kv_bytes=320 * per_token, kv_host_bytes=4000 * per_token)
    steps = [requests[i * len(TEXTS):(i + 1) * len(TEXTS)] for i in range(len(TEMPLATES))] + \
        [requests[:len(TEXTS)]]
    tree, fresh, ours = small.runner.tree, [], []
    for step in steps:
        work = QueryWork()
        ours += [row[1] for row in small.score(step, work)]
        fresh.append(work.stats.fresh_tokens)
    assert np.abs(np.exp(ours) - np.concatenate([hf_probabilities, hf_probabilities[:len(TEXTS)]])).max() <= 1e-4
    assert sum(r.prefix(2)[0] for r in steps[0]) > 2 * 320, "more documents than the pool holds"
    assert tree.counts.offloaded > 320 and tree.counts.restored > 320
    assert max(fresh[1:]) < fresh[0] / 2, "later steps copy the documents back"
