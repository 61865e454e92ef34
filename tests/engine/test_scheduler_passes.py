"""How one query's prompts become passes: shared prefixes computed once, work counted, passes filled to the budget."""

from __future__ import annotations

import numpy as np
import pytest

from quail.engine.ai.asking import Question, build_requests
from quail.engine.kv.token_prefix import common_start
from quail.engine.runtime import step_parts
from quail.engine.runtime.counters import causal_pairs
from quail.engine.runtime.model_runner import ModelRunner
from quail.engine.runtime.packing import Fill, pack
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.radix import build, collapse, common_prefix, ideal_stats, nodes
from quail.engine.runtime.requests import Request, Segment
from tests.engine.scheduler_requests import request

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)


def seqs_of(*lists):
    return [request(x) for x in lists]


def distinct_prefixes(requests) -> int:
    return len({tuple(r.ids()[:k]) for r in requests for k in range(1, len(r) + 1)})


def _random_requests(aligned: bool) -> list[Request]:
    """Prompts sharing prefixes of a base; aligned: all cut into segments at the same place."""
    rng = np.random.default_rng(1)
    base = rng.integers(0, 5, 12)
    out = []
    for _ in range(40):
        ids = np.concatenate([base[: rng.integers(0, 12)], rng.integers(0, 5, rng.integers(1, 6))])
        cut = 3 if aligned else int(rng.integers(0, len(ids)))
        out.append(request(ids[:cut], ids[cut:]))
    return out + [request(out[0].ids()[:3], out[0].ids()[3:]), request(out[3].ids()[:2])]


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned-segments", "mixed-segments"])
def test_tree_edges_spell_every_sequence_once(aligned):
    seqs = _random_requests(aligned)
    root = build(seqs)
    found = {}

    def walk(node, prefix):
        if node.rep >= 0:
            assert np.array_equal(seqs[node.rep].ids()[: node.start], prefix)
            prefix = np.concatenate([prefix, seqs[node.rep].tokens(node.start, node.end)])
        for i in node.ends:
            found[i] = prefix
        for child in node.children:
            walk(child, prefix)

    walk(root, np.array([], dtype=np.int32))
    assert sorted(found) == list(range(len(seqs)))
    assert all(np.array_equal(found[i], s.ids()) for i, s in enumerate(seqs))
    computed = sum(len(n) for n in nodes(root))
    if aligned:
        assert computed == distinct_prefixes(seqs), "each distinct prefix exactly once"
    else:
        assert distinct_prefixes(seqs) <= computed < sum(len(r) for r in seqs)


def test_common_prefix_across_segment_boundaries():
    assert common_prefix(request([1, 2], [3, 4]), request([1, 2, 3], [4, 5])) == 4
    assert common_prefix(request([1, 2], [3]), request([1, 2], [3])) == 3
    assert common_prefix(request([7], [1, 2, 9]), request([7], [1, 2, 8])) == 3
    assert common_prefix(request([1, 2]), request([5])) == 0
    assert common_prefix(request([7, 256, 3]), request([7, 512, 3])) == 1, "tokens sharing their first bytes"


def test_ideal_stats_by_hand():
    stats = ideal_stats(seqs_of([1, 2, 3, 4], [1, 2, 3, 5], [1, 2], [1, 2, 3, 4], [9], [1, 2, 7, 7, 7]))
    assert (stats.logical_tokens, stats.fresh_tokens, stats.attention_pairs) == (20, 9, 27)
    assert (stats.kv_written, stats.kv_read) == (3, 10)


@pytest.fixture(scope="module")
def shared_requests(runtime):
    """Four documents, three questions each, asked in question-major (arrival) order."""
    docs = [f"Document number {i} talks about topic {i * 7} at some length." for i in range(4)]
    questions = ["Is {0} about sports?", "Is {0} short?", "Does {0} name a number?"]
    return [r for q in questions for r in build_requests(runtime, Question(q), [[d] for d in docs])]


def test_strategies_count_their_work(runtime, shared_requests):
    ideal = ideal_stats(shared_requests)
    counts = {}
    for name in ("quail", "naive", "prefix"):
        work = QueryWork()
        stats = work.stats
        runtime.variant(name, token_budget=256).score(shared_requests, work)
        counts[name] = stats
        assert stats.logical_tokens == ideal.logical_tokens
    assert counts["naive"].fresh_tokens == ideal.logical_tokens
    kept = list(nodes(collapse(build(shared_requests))))
    assert counts["quail"].fresh_tokens == sum(len(n) for n in kept), "the radix plan computes each kept prefix once"
    assert counts["quail"].fresh_tokens <= 1.1 * ideal.fresh_tokens, "only short branch points computed again"
    assert counts["quail"].planned_tokens == counts["quail"].fresh_tokens, "progress ends at what was planned"
    assert counts["prefix"].planned_tokens == counts["naive"].planned_tokens == ideal.logical_tokens
    assert counts["quail"].attention_pairs == sum(causal_pairs(len(n), n.start) for n in kept)
    assert ideal.fresh_tokens < counts["prefix"].fresh_tokens < counts["naive"].fresh_tokens


def test_identical_requests_are_computed_once(runtime):
    segment = Segment.of(np.arange(10, 30, dtype=np.int32), runtime.model_id)
    requests = [Request((segment,), runtime.yes_no)] * 3
    work = QueryWork()
    stats = work.stats
    out = runtime.score(requests, work)
    assert stats.fresh_tokens == 20 and stats.cached_tokens == 40
    assert all(np.array_equal(out[0], o) for o in out)


def test_pairs_formula_matches_brute_force():
    seqs = seqs_of([1, 2, 3], [1, 2, 4, 5], [6])
    ideal = ideal_stats(seqs)
    pairs = 0
    for prefix in {tuple(r.ids()[:k]) for r in seqs for k in range(1, len(r) + 1)}:
        pairs += len(prefix)  # a fresh token at position p attends to p + 1 keys
    assert ideal.attention_pairs == pairs
    assert ideal.fresh_tokens == distinct_prefixes(seqs)


def test_short_prefixes_fold_into_long_children_and_answers_stay():
    preamble = list(range(100, 104))
    long_docs = [request(preamble + list(range(200 + 50 * i, 240 + 50 * i))) for i in range(3)]
    root = collapse(build(long_docs))
    assert [len(c) for c in root.children] == [44, 44, 44], "a 4-token preamble is not kept before 40-token docs"
    anchor = list(range(300, 340))
    short_questions = [request(anchor + [7, i]) for i in range(3)]
    root = collapse(build(short_questions))
    (kept,) = root.children
    assert len(kept) == 41 and [len(c) for c in kept.children] == [1, 1, 1]
    partners = [request(anchor + [7, 10 + i, 20 + i, 30 + i]) for i in range(3)] + [request(anchor + [8, 9])]
    (kept,) = collapse(build(partners)).children
    assert len(kept) == 40 and sorted(len(c) for c in kept.children) == [2, 4, 4, 4], \
        "the partners' common first token is computed in each, not kept below the anchor"


def test_passes_bound_padding_per_bucket():
    lengths = [300] * 20 + [15] * 400  # anchors and their partners' short suffixes
    fill = Fill(16384)
    for n in lengths:
        assert fill.admits(n)
        fill.add(n)
    assert not Fill(16384, 16000, {512: (1, 400)}).admits(400), "the token budget still binds"
    assert pack([4000] + [15] * 1000, 16384) == [[0] + list(range(1, 826)), list(range(826, 1001))]
    crowded = {128: (300, 128)}  # 300 rows padded to 128 tokens: more than twice the budget's area
    assert not Fill(16384, 10000, dict(crowded)).admits(65)
    assert Fill(16384, 10000, dict(crowded), padded=False).admits(65), "unpadded (flash varlen): tokens bind"


def test_passes_mix_continuations_with_new_roots(runtime):
    """Anchors with many short partners: partner rows fill the passes beside the next anchors."""
    rng = np.random.default_rng(3)
    anchors = [rng.integers(1000, 2000, 100) for _ in range(12)]
    requests = [request(anchor, [7, 8, p, 9]) for anchor in anchors for p in range(10, 22)]
    work = QueryWork()
    runtime.variant("quail", token_budget=256).score(requests, work)
    fresh = work.stats.fresh_tokens
    assert fresh == ideal_stats(requests).fresh_tokens
    assert work.stats.forward_passes <= -(-fresh // 256) + 2, "passes are filled across levels"


def test_the_kv_ledger_counts_kept_kv_until_the_plan_is_done_with_it(runtime, monkeypatch):
    """Anchors' KV counts while their partners run, and none is left once the query returns: the owner loop
    lets go of the last pass's rows and kept KV before it tells the query it is done."""
    rng = np.random.default_rng(4)
    anchors = [rng.integers(1000, 2000, 100) for _ in range(6)]
    requests = [request(anchor, [7, 8, p, 9]) for anchor in anchors for p in range(10, 22)]
    seen, forward = [], ModelRunner.passing

    def counting(self, groups, *rest):
        seen.append(self.ledger.resident_bytes)
        return forward(self, groups, *rest)

    monkeypatch.setattr(ModelRunner, "passing", counting)
    quail = runtime.variant("quail", token_budget=256)
    quail.score(requests, QueryWork())
    assert max(seen) > 0, "anchors' KV was resident while their partners ran"
    assert quail.runner.ledger is runtime.runner.ledger and runtime.runner.ledger.resident_bytes == 0


def test_documents_below_a_shared_preamble_run_depth_first(runtime, monkeypatch):
    """A preamble kept over many documents: each pass's documents have their questions asked in the
    next pass, before further documents pile up resident KV."""
    rng = np.random.default_rng(4)
    preamble = rng.integers(1000, 2000, 300)
    documents = [rng.integers(2000, 3000, 100) for _ in range(15)]  # three passes' worth
    requests = [request(preamble, doc, [7, 8, p, 9]) for doc in documents for p in range(10, 16)]
    passes = []
    forward = type(runtime.runner).passing

    def recording(self, groups, *rest):
        rows = [row for owned, _ in groups for row in owned]
        passes.append((sum(len(r.ids) >= 100 for r in rows), sum(len(r.ids) <= 4 for r in rows)))
        return forward(self, groups, *rest)

    monkeypatch.setattr(type(runtime.runner), "passing", recording)
    work = QueryWork()
    runtime.variant("quail", token_budget=512).score(requests, work)
    assert work.stats.fresh_tokens == ideal_stats(requests).fresh_tokens, "the preamble is computed once"
    resident = 0
    for documents_run, questions_run in passes[1:]:
        resident += documents_run - questions_run // 6
        assert resident <= 5, f"documents waiting for their questions: {passes}"
    assert resident == 0


def test_label_trie_branches_where_names_part():
    from quail.engine.ai.labels import branches, name_logprobs
    from quail.engine.errors import InvalidArgument

    found = branches([[5, 1], [5, 2, 7], [6], [5, 2, 8]])
    assert [(b.path, b.ways) for b in found] == [((), {5: [0, 1, 3], 6: [2]}), ((5,), {1: [0], 2: [1, 3]}),
                                                 ((5, 2), {7: [1], 8: [3]})]
    logp = name_logprobs(found, [np.log([0.5, 0.5]), np.log([0.25, 0.75]), np.log([0.1, 0.9])], 4)
    np.testing.assert_allclose(np.exp(logp), [0.125, 0.0375, 0.5, 0.3375])
    with pytest.raises(InvalidArgument, match="start of another"):
        branches([[5], [5, 2]])


def test_warm_up_runs_full_passes_over_a_shared_prefix_and_long_anchors(runtime):
    """What a GPU runtime runs before its first query: more than a full pass of rows after one short
    prefix, and short rows after two long ones, each prefix computed once; one short request alone always."""
    small = runtime.variant("quail", token_budget=1024)
    stats = small.warm_up(full=True)
    rows = 1024 // 200 + 8
    assert stats.requests == 1 + rows + 120 and stats.forward_passes >= 4
    assert stats.logical_tokens - stats.fresh_tokens >= 200 * (rows - 1) + 600 * 118
    assert stats.kv_read > 0, "rows continued resident prefixes"
    quick = runtime.warm_up(full=False)
    assert quick.requests == 1 and quick.forward_passes == 1


def test_a_short_prefix_and_its_children_share_one_pass(runtime):
    """A short preamble kept before documents (their common first word a branch point): the preamble
    and the documents run in one pass (each document after the preamble's keys of that pass), and the
    answers are those of every prompt computed in full."""
    rng = np.random.default_rng(5)
    preamble = rng.integers(1000, 2000, 8)
    requests = [request(preamble, [5 + q % 2, *rng.integers(2000, 3000, 40)], [7, q, 9]) for q in range(6)]
    answers, works = {}, {}
    for name in ("quail", "naive"):
        works[name] = QueryWork()
        answers[name] = np.array(runtime.variant(name, token_budget=4096).score(requests, works[name]))
        assert works[name].stats.forward_passes == 1, name
    assert works["quail"].stats.fresh_tokens == works["naive"].stats.fresh_tokens - 8 * 5
    np.testing.assert_allclose(np.exp(answers["quail"]), np.exp(answers["naive"]), atol=1e-5)
    tight = QueryWork()
    runtime.runner.tree.clear()  # nothing resident from the runs above
    np.testing.assert_allclose(np.exp(runtime.variant("quail", token_budget=64).score(requests, tight)),
                               np.exp(answers["naive"]), atol=1e-5)
    assert tight.stats.forward_passes > 1 and tight.stats.fresh_tokens == works["quail"].stats.fresh_tokens, \
        "documents that did not fit the preamble's pass continue its KV later"


def test_long_prompts_run_in_passes_no_longer_than_the_budget(runtime, monkeypatch):
    """Prompts several budgets long (one shared, one alone) run in chunks: no pass exceeds the budget, the
    answers equal one unbounded pass's, and each token is computed once."""
    rng = np.random.default_rng(5)
    shared, alone = rng.integers(1000, 2000, 350), rng.integers(1000, 2000, 450)
    requests = [request(shared, [7, p, 9]) for p in range(10, 13)] + [request(alone, [7, 9])]
    sizes = []
    forward = type(runtime.runner).passing

    def recording(self, groups, *rest):
        sizes.append(sum(len(row.ids) for owned, _ in groups for row in owned))
        return forward(self, groups, *rest)

    whole = np.array(runtime.variant("quail", token_budget=4096).score(requests))
    runtime.runner.tree.clear()
    monkeypatch.setattr(type(runtime.runner), "passing", recording)
    work = QueryWork()
    chunked = np.array(runtime.variant("quail", token_budget=128).score(requests, work))
    assert max(sizes) <= 128 and len(sizes) >= -(-(350 + 450) // 128)
    assert work.stats.fresh_tokens == ideal_stats(requests).fresh_tokens
    np.testing.assert_allclose(chunked, whole, atol=1e-4)


def test_a_large_step_is_cut_once_where_rows_share_least():
    fresh = [100.0] * 200
    shared = [50 if i % 10 else 0 for i in range(200)]  # groups of ten rows share a prefix
    head, rest = step_parts._parts(fresh, shared, per_pass=500.0)
    assert head == range(0, 20) and rest == range(20, 200), "about four passes first, cut between groups"
    shared[20] = 50  # the group boundary nearest the target is gone: the next nearest
    assert step_parts._parts(fresh, shared, per_pass=500.0)[0] in (range(0, 10), range(0, 30))
    assert step_parts._parts([100.0] * 60, [0] * 60, per_pass=500.0) == [range(0, 60)], "a small step is not cut"
    assert step_parts._parts([], [], per_pass=500.0) == []


@pytest.mark.parametrize("a, b", [("", ""), ("abc", "abd"), ("x" * 5000 + "1", "x" * 5000 + "2"), ("ab", "abc"),
                                  ("same", "same"), ("a", "b")])
def test_common_start(a, b):
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_start(a, b) == common
    assert common_start(a.encode(), b.encode()) == common
