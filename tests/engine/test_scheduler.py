"""The scheduler and the radix plan: passes shared by queries, strategies' bookkeeping, a step's parts."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

from quail.engine.ai.asking import Question, build_requests, yes_probabilities
from quail.engine.errors import InvalidArgument
from quail.engine.kv.token_prefix import common_start
from quail.engine.runtime import model_runner, scheduler, step_parts
from quail.engine.runtime.counters import Stats, causal_pairs
from quail.engine.runtime.model_runner import ModelRunner
from quail.engine.runtime.packing import Fill, Share, pack
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.radix import build, collapse, common_prefix, ideal_stats, nodes
from quail.engine.runtime.requests import LabelSet, Request, Segment

LABELS = LabelSet(("false", "true"), (0, 1), (0, 1))


def request(*segments) -> Request:
    return Request(tuple(Segment.of(np.array(s, dtype=np.int32), "test") for s in segments), LABELS)


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


class BrokenFill:
    """A job whose pass breaks as it is filled, before any row: the owner loop ends it with that error."""

    pass_tokens = None

    def __init__(self, runtime) -> None:
        self.runner, self.stats = runtime.runner, Stats()

    def done(self) -> bool:
        return False

    def fill(self, fill) -> None:
        raise RuntimeError("a broken fill")


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


def test_a_prompt_longer_than_the_context_is_refused_before_any_pass(runtime, monkeypatch):
    monkeypatch.setattr(type(runtime.runner), "passing", lambda *a: pytest.fail("no pass may run"))
    too_long = request(np.ones(runtime.config.max_position + 1, dtype=np.int32))
    with pytest.raises(InvalidArgument, match=f"reads at most {runtime.config.max_position:,}"):
        runtime.score([request([1, 2, 3]), too_long], QueryWork())
    text = "word " * runtime.config.max_position
    with pytest.raises(InvalidArgument, match="a text beginning 'word word"):
        yes_probabilities(runtime, Question("Is {0} long?"), [["short", text]])


def test_a_step_past_the_token_limit_is_refused_before_any_pass(runtime, monkeypatch):
    from quail.engine.errors import ResourceExhausted

    texts = [f"review {i}: " + "the soup was cold " * 40 for i in range(40)]  # a step in two parts
    work = QueryWork(max_tokens=2000)
    monkeypatch.setattr(type(runtime.runner), "passing", lambda *a: pytest.fail("no pass may run"))
    with pytest.raises(ResourceExhausted, match="more than 2,000 tokens"):
        yes_probabilities(runtime.variant("quail", token_budget=256), Question("Is {0} kind?"), [texts], work)
    assert work.stats.forward_passes == 0 and work.stats.logical_tokens == 0


def _scores(runtime, requests) -> np.ndarray:
    return np.exp(np.array(runtime.score(requests)))


def _nested(inside: list, passing, *args):
    """The pass `passing(*args)`, counted in `inside` while it runs: a pass that finds it non-empty runs inside
    another."""
    inside.append(1)
    try:
        return (yield from passing(*args))
    finally:
        inside.pop()


def test_a_short_query_sent_while_a_long_one_s_pass_is_queued_cuts_into_it(runtime, monkeypatch):
    """A long query (many passes) and a short one sent while the long one's first pass is being filled: the
    short one runs in a pass of its own inside that one, between two of its layers, and is done there; the
    long one has rows in every other pass, and both get the answers they get alone."""
    rng = np.random.default_rng(7)
    small = runtime.variant("quail", token_budget=256)
    long = [request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(12)]  # about five passes alone
    short = [request(rng.integers(2000, 3000, 20), [7, 9]) for _ in range(2)]
    alone = {"long": _scores(small, long), "short": _scores(small, short)}
    runtime.runner.tree.clear()
    works = {"long": QueryWork(), "short": QueryWork()}
    owners = {id(works[name].stats): name for name in works}
    passes: list[tuple[list[str], int]] = []  # each pass's owners, and how many passes it ran inside
    inside = []
    first_in, release = threading.Event(), threading.Event()
    forward = type(runtime.runner).passing

    def recording(self, groups, *rest):
        passes.append(([owners.get(id(stats), "?") for owned, stats in groups if owned], len(inside)))
        if len(passes) == 1:
            first_in.set()
            release.wait(30)
        return _nested(inside, forward, self, groups, *rest)

    monkeypatch.setattr(type(runtime.runner), "passing", recording)
    got = {}

    def query(name: str, requests) -> None:
        got[name] = np.exp(np.array(small.score(requests, works[name])))

    threads = {"long": threading.Thread(target=query, args=("long", long))}
    threads["long"].start()
    assert first_in.wait(30)
    threads["short"] = threading.Thread(target=query, args=("short", short))
    threads["short"].start()
    while small.scheduler.waiting() < 2:
        threading.Event().wait(0.01)
    release.set()
    for thread in threads.values():
        thread.join(60)
    assert passes[:2] == [(["long"], 0), (["short"], 1)], passes
    assert all(names == ["long"] and depth == 0 for names, depth in passes[2:]), passes
    for name in works:
        np.testing.assert_allclose(got[name], alone[name], atol=1e-4)
        assert works[name].stats.forward_passes == sum(name in names for names, _ in passes)


def test_short_queries_cut_into_a_pass_while_they_hold_fewer_tokens_than_it(runtime, monkeypatch):
    """Short queries sent one after another while a long query's pass is queued, one a layer: each cuts into
    it in a pass of its own, until the passes cut in hold as many tokens as the pass around them; the
    later ones wait for the next pass. Every answer is the one each query gets alone."""
    rng = np.random.default_rng(11)
    small = runtime.variant("quail", token_budget=256)
    long = [request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(6)]
    shorts = [[request(rng.integers(2000, 3000, 20), [7, 9]) for _ in range(2)] for _ in range(9)]
    alone = [_scores(small, requests) for requests in [long, *shorts]]
    runtime.runner.tree.clear()
    works = [QueryWork() for _ in range(10)]
    owners = {id(work.stats): k for k, work in enumerate(works)}
    passes: list[tuple[list[int], int, int]] = []  # each pass's owners, tokens, and how many passes it ran inside
    inside, threads, got = [], [], {}
    model, forward = runtime.runner.model, type(runtime.runner).passing
    finish = type(model).finish

    def query(k: int, requests) -> None:
        got[k] = np.exp(np.array(small.score(requests, works[k])))

    def recording(self, groups, *rest):
        passes.append(([owners[id(stats)] for owned, stats in groups if owned],
                       sum(len(row.ids) for owned, _ in groups for row in owned), len(inside)))
        return _nested(inside, forward, self, groups, *rest)

    def sending(self, layer, *args):
        if len(passes) >= 1 and passes[0][0] == [0] and inside == [1] and len(threads) < len(shorts):
            waiting = small.scheduler.waiting()  # one short query sent a layer, each in the scheduler
            threads.append(threading.Thread(target=query, args=(len(threads) + 1, shorts[len(threads)])))
            threads[-1].start()
            while small.scheduler.waiting() == waiting and threads[-1].is_alive():
                threading.Event().wait(0.005)
        return finish(self, layer, *args)

    monkeypatch.setattr(type(runtime.runner), "passing", recording)
    monkeypatch.setattr(type(model), "finish", sending)
    busy, before, began = small.scheduler.busy, small.scheduler.busy.seconds(), time.perf_counter()
    query(0, long)
    for thread in threads:
        thread.join(60)
    assert 0 < busy.seconds() - before <= time.perf_counter() - began, "the passes cut in count once"
    first, tokens, _ = passes[0]
    cut = [(names, n) for names, n, depth in passes if depth == 1]
    assert first == [0] and cut == [(names, n) for names, n, _ in passes[1:len(cut) + 1]], passes
    assert all(len(names) == 1 for names, _ in cut), "each its own pass, sent a layer apart"
    assert sum(n for _, n in cut[:-1]) < tokens <= sum(n for _, n in cut) and len(cut) < len(shorts), passes
    assert all(depth == 0 for _, _, depth in passes[len(cut) + 1:]), "the rest wait for the next pass"
    for k, want in enumerate(alone):
        np.testing.assert_allclose(got[k], want, atol=1e-4)


@pytest.mark.parametrize("opening", [None, 4], ids=["cpu", "four-layers"])
def test_a_query_is_under_way_once_the_host_queued_the_opening_layers_of_its_first_pass(runtime, monkeypatch,
                                                                                        opening):
    """QueryWork.under_way (what a prepared query's result schema waits for, server/query_service.py) is set
    by the first pass holding the query's rows once the host has queued that pass's opening layers: not
    before the pass, and not only at its end. On the CPU, from the pass's start; on CUDA (its count of
    layers here on the CPU), from that layer on."""
    if opening is not None:
        monkeypatch.setattr(model_runner, "opening_layers", lambda device: opening)
    work, layers, entered = QueryWork(), [], []
    model = runtime.runner.model
    finish, forward = type(model).finish, type(runtime.runner).passing

    def recording(self, layer, *args):
        layers.append((layer, work.under_way.is_set()))
        return finish(self, layer, *args)

    def entering(self, groups, *rest):
        entered.append(work.under_way.is_set())
        return forward(self, groups, *rest)

    monkeypatch.setattr(type(model), "finish", recording)
    monkeypatch.setattr(type(runtime.runner), "passing", entering)
    runtime.score([request(np.arange(1000, 1040), [7, 9])], work)
    assert work.under_way.is_set() and len(model.layers) > model_runner.OPENING_LAYERS
    assert entered == [False] and len(layers) == len(model.layers), "one pass, not under way before it"
    assert [layer for layer, under_way in layers if under_way][0] == (opening or 0)


def test_queries_at_once_over_the_same_documents_compute_each_document_once(runtime):
    """Four queries sent together, each asking its own question of the same documents (a dashboard's
    tiles): each document is computed by one of them and continued by the others, and every query gets
    the answers it gets alone."""
    rng = np.random.default_rng(11)
    preamble = rng.integers(1000, 2000, 6)
    documents = [rng.integers(2000, 3000, 60) for _ in range(8)]
    asks = [[request(preamble, doc, [7, 10 + q, 9]) for doc in documents] for q in range(4)]
    small = runtime.variant("quail", token_budget=256)
    alone = []
    for step in asks:
        runtime.runner.tree.clear()
        alone.append(_scores(small, step))
    runtime.runner.tree.clear()
    works = [QueryWork() for _ in asks]
    got: dict[int, np.ndarray] = {}

    def query(k: int) -> None:
        got[k] = np.exp(np.array(small.score(asks[k], works[k])))

    threads = [threading.Thread(target=query, args=(k,)) for k in range(len(asks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for k in range(len(asks)):
        np.testing.assert_allclose(got[k], alone[k], atol=1e-5)
    fresh = sum(work.stats.fresh_tokens for work in works)
    assert fresh <= len(documents) * (6 + 60 + 3) + 3 * len(documents) * 3, \
        "each document once, then only the other questions"


def _cancelled_after(passes: int) -> QueryWork:
    """A query's work that is cancelled at its first check after `passes` forward passes."""
    work = QueryWork()
    original = work.check

    def check() -> None:
        if work.stats.forward_passes >= passes:
            work.cancel()
        original()

    work.check = check
    return work


def test_a_cancelled_query_leaves_before_the_next_pass(runtime):
    """A query whose check raises between passes gets that error and has no rows in any later pass;
    the query beside it finishes with its own answers."""
    from quail.engine.errors import Cancelled

    rng = np.random.default_rng(8)
    small = runtime.variant("quail", token_budget=256)
    long = [request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(24)]
    other = [request(rng.integers(2000, 3000, 100), [7, 9]) for _ in range(12)]
    alone = _scores(small, other)
    cancelled, errors, got = _cancelled_after(2), [], {}

    def cancelling() -> None:
        try:
            small.score(long, cancelled)
        except Cancelled as err:
            errors.append(err)

    thread = threading.Thread(target=cancelling)
    thread.start()
    got["other"] = np.exp(np.array(small.score(other)))
    thread.join(60)
    assert errors and cancelled.stats.forward_passes == 2, "it ran no pass after it was cancelled"
    np.testing.assert_allclose(got["other"], alone, atol=1e-4)


def test_a_cancelled_query_s_kv_goes_with_its_error(runtime):
    """The error a query cancelled between passes gets carries its frames (its job, its runs of KV); once
    the caller drops it, none of the query's KV is held: no reference cycle through the scheduler keeps it
    until a garbage collection."""
    from quail.engine.errors import Cancelled

    rng = np.random.default_rng(9)
    small = runtime.variant("quail", token_budget=256)
    documents = [rng.integers(1000, 2000, 120) for _ in range(12)]  # the questions continue their KV
    prompts = [request(document, rng.integers(100, 200, 4), [7, 9]) for document in documents for _ in range(3)]
    cancelled = _cancelled_after(2)
    gc.disable()
    try:
        try:
            small.score(prompts, cancelled)
        except Cancelled:
            pass
        assert cancelled.stats.forward_passes == 2 and small.runner.ledger.resident_bytes == 0
    finally:
        gc.enable()


def test_a_job_that_breaks_its_pass_gets_the_error_and_the_loop_goes_on(runtime):
    """A fault outside any one query's rows (here: filling the pass) ends the queries of that pass with
    it; the scheduler goes on serving the next ones."""
    with pytest.raises(RuntimeError, match="a broken fill"):
        runtime.scheduler.run(BrokenFill(runtime))
    assert len(runtime.score([request([1, 2, 3])])) == 1


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


def _beside_a_scan(runtime, monkeypatch, small, scan, works, second) -> list[tuple[list[str], int, bool]]:
    """Each pass's owners (names of `works`), tokens and whether a job waiting then bounded its passes, while
    `small` runs the scan (as works["scan"]) and, once the scan's first pass is being filled, `second()`:
    that pass waits until both are in the scheduler."""
    owners = {id(work.stats): name for name, work in works.items()}
    passes: list[tuple[list[str], int, bool]] = []
    first_in, release = threading.Event(), threading.Event()
    forward = type(runtime.runner).passing

    def recording(self, groups, *rest):
        bounded = any(waiting.job.pass_tokens is not None for waiting in list(small.scheduler._waiting))
        passes.append(([owners.get(id(stats), "?") for owned, stats in groups if owned],
                       sum(len(row.ids) for owned, _ in groups for row in owned), bounded))
        if len(passes) == 1:
            first_in.set()
            release.wait(30)
        return forward(self, groups, *rest)

    monkeypatch.setattr(type(runtime.runner), "passing", recording)
    threads = [threading.Thread(target=small.score, args=(scan, works["scan"])), threading.Thread(target=second)]
    threads[0].start()
    assert first_in.wait(30)
    threads[1].start()
    while small.scheduler.waiting() < 2:
        threading.Event().wait(0.01)
    release.set()
    for thread in threads:
        thread.join(120)
    return passes


def test_passes_stay_short_while_a_query_decodes(runtime, monkeypatch):
    """A scan and a query generating text at once: while the latter decodes, every pass holds at most
    DECODE_PASS_TOKENS tokens (each of its tokens waits for a pass), the scan's rows beside its steps; the
    scan alone fills a pass."""
    from quail.engine.runtime.decode import DecodeJob, Decoding

    monkeypatch.setattr(DecodeJob, "pass_tokens", 128)
    monkeypatch.setattr(scheduler, "SHORT_PASS_TOKENS", 64)  # the scan is not short; the prompts' prefill is
    monkeypatch.setattr(scheduler, "SHORT_WINDOW_S", 0.0)
    rng = np.random.default_rng(8)
    small = runtime.variant("quail", token_budget=256)
    small.scheduler._short_until = 0.0  # no window left open by an earlier test's short query
    scan = [request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(12)]
    prompts = [request(rng.integers(2000, 3000, 20), [7, 9]) for _ in range(2)]
    works = {"scan": QueryWork(), "generate": QueryWork()}
    passes = _beside_a_scan(runtime, monkeypatch, small, scan, works,
                            lambda: small.generate(prompts, Decoding(6), works["generate"]))
    assert passes[0][1] > 150, "the scan alone fills a pass"
    beside = [(names, tokens) for names, tokens, bounded in passes if bounded]
    assert any(set(names) == {"scan", "generate"} for names, _ in beside), passes
    assert all(tokens <= 128 for _, tokens in beside), passes
    assert works["generate"].stats.decode_steps == 5


def test_a_short_job_rides_short_passes_beside_a_scan(runtime, monkeypatch):
    """A short statement arriving during a scan: it cuts into the pass being queued (a pass of its own, all
    its rows), and from its arrival on (for SHORT_WINDOW_S, here longer than the test) every pass holds at
    most SHORT_PASS_TOKENS, so the next short statement of a burst finds a short pass in flight; the scan
    goes on in short passes after it; before it the scan fills its passes."""
    monkeypatch.setattr(scheduler, "SHORT_PASS_TOKENS", 160)
    monkeypatch.setattr(scheduler, "SHORT_WINDOW_S", 600.0)
    rng = np.random.default_rng(9)
    small = runtime.variant("quail", token_budget=256)
    small.scheduler._short_until = 0.0  # no window left open by an earlier test's short query
    scan = [request(rng.integers(1000, 2000, 30), [7, 9]) for _ in range(40)]
    short = [request(rng.integers(2000, 3000, 20), [7, 9]) for _ in range(5)]
    works = {"scan": QueryWork(), "short": QueryWork()}
    passes = _beside_a_scan(runtime, monkeypatch, small, scan, works, lambda: small.score(short, works["short"]))
    small.scheduler._short_until = 0.0
    assert passes[0][1] > 150, "the scan alone fills its passes"
    assert all(tokens <= 160 for _, tokens, _ in passes[1:]), passes
    assert [names for names, _, _ in passes if "short" in names] == [["short"]], "all its rows in one pass"
    assert passes[-1][0] == ["scan"], "the scan goes on after it"
    passes.clear()
    small.score(short[:1] + [request(rng.integers(2000, 3000, 20), [7, 9])], QueryWork())
    small.score([request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(3)], QueryWork())
    assert max(tokens for _, tokens, _ in passes) > 150, "a short query alone opens no window: a scan after it fills its pass"


class _Rows:
    """A job as `_share_out` sees it (a query of its own): rows of `length` tokens, as many as its shares
    admit."""

    def __init__(self, count: int, length: int, bounded: bool) -> None:
        self.job, self.count, self.length = self, count, length
        self.pass_tokens = 1 if bounded else None
        self.stats = Stats()
        self.took = 0

    def fill(self, share: Share) -> None:
        while self.took < self.count and share.admits(self.length):
            share.add(self.length)
            self.took += 1


def test_the_first_queries_share_a_pass_and_later_ones_take_what_they_leave_in_order():
    """Five scans queued beside one another: the four that came first take an equal share each, the fifth
    waits. Four small ones first: what they leave goes to the fifth query before the sixth. Two jobs of one
    query (a step's parts) count as one query among the four and take its share together, the later one
    what the earlier leaves."""
    def taken(counts: list[int], same_query: bool = False) -> list[int]:
        jobs = [_Rows(count, 100, bounded=False) for count in counts]
        if same_query:
            jobs[1].stats = jobs[0].stats
        scheduler._share_out(Fill(8000, padded=False), jobs)
        return [job.took for job in jobs]

    assert taken([50] * 5) == [20, 20, 20, 20, 0]
    assert taken([10] * 4 + [50, 50]) == [10] * 4 + [40, 0]
    assert taken([50] * 6, same_query=True) == [20, 0, 20, 20, 20, 0]
    assert taken([5] + [50] * 5, same_query=True) == [5, 15, 20, 20, 20, 0]


def test_bounded_jobs_fill_a_pass_first_and_a_scan_moves_every_other_pass():
    scan, short = _Rows(100, 30, bounded=False), _Rows(5, 20, bounded=True)
    assert not scheduler._share_out(Fill(160, padded=False), [scan, short])
    assert (short.took, scan.took) == (5, 2), "the short job first, all of it; the scan takes what is left"
    scan, shorts = _Rows(100, 30, bounded=False), [_Rows(5, 20, bounded=True) for _ in range(3)]
    assert scheduler._share_out(Fill(100, padded=False), [scan, shorts[0]]), "the scan got nothing"
    assert not scheduler._share_out(Fill(100, padded=False), [scan, shorts[1]], others_first=True)
    assert (scan.took, shorts[1].took) == (2, 2), "then both alike: an equal share each"
    assert scheduler._share_out(Fill(100, padded=False), [scan, shorts[1], shorts[2]])
    assert (shorts[1].took, shorts[2].took) == (5, 2), "bounded jobs share as every job does"
    scan_alone = _Rows(100, 30, bounded=False)
    assert not scheduler._share_out(Fill(100, padded=False), [scan_alone]) and scan_alone.took == 3
