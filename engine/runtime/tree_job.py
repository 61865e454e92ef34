"""The quail strategy: in what order a step's requests are computed, each shared prefix once.

- Longest roots first, depth first; short prefixes joined by their children in one pass (`_shares`);
  prompts longer than a pass in chunks (`_chunked`).
- Each request after the resident prefix it continues (`_continued`: whole segments, or a long shared
  run), its KV fetched from the tree as late as it can be (`Fetch`).
- A document another running query is computing is waited for, not computed twice (`_Hold`).
- The passes are the scheduler's (`scheduler.run(job)`), shared with the other queries.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from quail.engine.runtime.counters import Stats
from quail.engine.runtime.packing import Row, Share
from quail.engine.runtime.radix import RadixNode, build, collapse, nodes
from quail.engine.runtime.requests import Request, document_prefix
from quail.engine.runtime.scheduler import PassScheduler, pass_tokens

if TYPE_CHECKING:
    import torch

    from quail.engine.kv.leaves import Node
    from quail.engine.kv.resident import Match, ResidentTree
    from quail.engine.kv.runs import KV
    from quail.engine.runtime.model_runner import ModelRunner

Strategy = Callable[[PassScheduler, "ModelRunner", Sequence[Request], Stats], "list[torch.Tensor]"]

Item = tuple[RadixNode, "KV | Fetch | None", "int | None"]  # a node, the resident KV it continues, its parent's row


def tree(scheduler: PassScheduler, runner: ModelRunner, requests: Sequence[Request],
         stats: Stats) -> list[torch.Tensor]:
    """Last hidden state per request, each distinct prefix computed once (TreeJob), its passes the
    scheduler's, shared with the other queries on the device."""
    job = TreeJob(runner, requests, stats)
    try:
        scheduler.run(job)
    finally:  # done, cancelled or failed: its pins and claims end with it
        job.hold.release()
    return job.hidden


class TreeJob:
    """The quail strategy's work on a set of requests, a pass at a time.

    Passes are filled from the front of a frontier that starts as the roots,
    longest first. A short node's children join its own pass right behind it
    (`_shares`: they attend to its keys there, copied before each of them);
    the children of other nodes, and those that did not fit, go to the front
    once the pass ran, grouped by parent (each parent's KV one run): depth
    first, so a parent's KV is dropped as soon as its last child ran. With the
    runner's resident tree, each request continues the longest prefix of its
    prompt found there (pinned until the first item continuing it joins a pass,
    and taken from the tree then: copied back if it moved to the host tier, at
    most half a pool's worth a pass), and every prompt computed goes into it
    (kv/resident.py). A request whose document another running
    query has claimed waits for that query to compute it, then continues it;
    the job claims the others' documents.
    """

    def __init__(self, runner: ModelRunner, requests: Sequence[Request], stats: Stats) -> None:
        self.runner, self.requests, self.stats = runner, requests, stats
        self.hidden: list[torch.Tensor | None] = [None] * len(requests)
        self.frontier: deque[Item] = deque()
        self.hold = _Hold(runner.tree, requests)
        documents: dict[bytes, Match] = {}
        self.waiting = self.hold.claim(requests, documents)
        planned = self._start([i for i in range(len(requests)) if i not in self.waiting], documents)
        # short, unless it waits for another query's documents: then that query's passes bound its wait
        self.pass_tokens = None if self.waiting else pass_tokens(planned)
        self.items: list[Item] = []  # this pass's, with whether each one's children joined it, and its chain
        self.shared: list[bool] = []
        self.chain: list[int] = []
        self.restored = 0  # tokens this pass's items copied back from the lower tiers

    def _start(self, members: list[int], documents: dict[bytes, Match]) -> int:
        """The members' roots at the frontier's front, longest first; the tokens they plan (counted).
        `documents`: the matches of document prefixes made for them already (`_Hold.claim`; see `_roots`)."""
        roots = _roots(self.runner.tree, self.requests, members, self.hold, documents)
        roots = [(_chunked(node, self.runner.token_budget), kv, None) for node, kv in sorted(
            roots, key=lambda item: len(item[0]), reverse=True)]
        planned = sum(len(node) for root, *_ in roots for node in [root, *nodes(root)])
        self.stats.planned_tokens += planned
        self.frontier.extendleft(reversed(roots))
        return planned

    def done(self) -> bool:
        return not self.frontier and not self.items and not self.waiting

    def fill(self, fill: Share) -> None:
        """Items for the pass from the frontier's front while its share admits them; a node whose children
        join it pushes them to the front (parent: its index among this job's items). First, the requests
        waiting for another query's documents that it has computed (or given up) start."""
        if self.waiting:
            ready = [i for i, key in self.waiting.items() if not self.hold.waits_for(key)]
            for i in ready:
                del self.waiting[i]
            if ready:
                self._start(ready, {})
        while self.frontier and fill.admits(len(self.frontier[0][0])):
            if self.restored > self.runner.pool.slots // 2 and isinstance(self.frontier[0][1], Fetch) and \
                    self.frontier[0][1].kv is None:
                break  # the pass has copied back half a pool from the host tier: the rest waits for the next
            node, kv, parent = self.frontier.popleft()
            if isinstance(kv, Fetch):
                counts = self.runner.tree.counts
                host, disk = counts.restored, counts.from_disk
                kv = kv.run(self.hold)
                self.stats.host_restored_tokens += counts.restored - host
                self.stats.disk_restored_tokens += counts.from_disk - disk
                self.restored += counts.restored - host + counts.from_disk - disk
            fill.add(len(node))
            self.chain.append(0 if parent is None else self.chain[parent] + len(self.items[parent][0]))
            self.items.append((node, kv, parent))
            self.shared.append(bool(node.children) and _shares(self.chain[-1] + len(node), node.children))
            if self.shared[-1]:
                self.frontier.extendleft((child, kv, len(self.items) - 1) for child in sorted(node.children, key=len))

    def rows(self, base: int) -> list[Row]:
        """The items' rows, this job's first at index `base` of the pass: each keeps its KV when children
        continue it or the tree indexes it."""
        keeps = self.runner.tree is not None
        return [Row(self.requests[node.rep].tokens(node.start, node.end), kv,
                    len(node) if keeps or node.children else 0, None if parent is None else base + parent)
                for node, kv, parent in self.items]

    def take(self, last: torch.Tensor, kept: list[KV | None]) -> None:
        """The pass's results for this job's rows: hidden states of the requests that end there, the runs
        the children continue, the prompts indexed in the tree (and the claims on their documents ended)."""
        tree = self.runner.tree
        runs: list[KV | None] = []
        children: list[Item] = []
        for (node, kv, parent), h, new, joined in zip(self.items, last, kept, self.shared):
            for i in node.ends:
                self.hidden[i] = h
            base = runs[parent] if parent is not None else kv
            runs.append(None if new is None or not node.children else new if base is None else base.then(new))
            if tree is not None:
                tree.insert(self.requests[node.rep].tokens(0, node.end), new, node.start, base)
                self.hold.computed(node.rep, node.end)
            if node.children and not joined:
                children.extend((child, runs[-1], None) for child in sorted(node.children, key=len, reverse=True))
        while self.frontier and self.frontier[0][2] is not None:  # children that joined a pass they did not fit in
            node, _, parent = self.frontier.popleft()
            children.append((node, runs[parent], None))
        self.frontier.extendleft(reversed(children))
        self.items, self.shared, self.chain, self.restored = [], [], [], 0
        if self.done():
            self.hold.release()


class _Hold:
    """What a job holds in the resident tree: the nodes it continues (pinned) and the documents it claimed,
    until it is done (`release`, once)."""

    def __init__(self, tree: ResidentTree | None, requests: Sequence[Request]) -> None:
        self.tree = tree
        self.pins: dict[int, Node] = {}  # the node each Fetch (by id) continues, pinned until it has run
        self.claims: dict[bytes, int] = {}  # each claimed document's prefix length
        self.prefixes = [document_prefix(r) for r in requests] if tree is not None else []

    def claim(self, requests: Sequence[Request], documents: dict[bytes, Match]) -> dict[int, bytes]:
        """Claim the documents of the requests that the tree lacks; the requests whose document another
        job claimed, and that document's key (they wait for it). Each document prefix's match goes into
        `documents`, its node pinned (as `_roots` takes them)."""
        waiting: dict[int, bytes] = {}
        if self.tree is None:
            return waiting
        others: set[bytes] = set()  # documents another job claimed
        for i, (request, prefix) in enumerate(zip(requests, self.prefixes)):
            if prefix is None:
                continue
            length, key = prefix
            if key not in documents:
                documents[key] = _document_match(self.tree, request, length)
                if documents[key].length < length:
                    if self.tree.claim(key, self):
                        self.claims[key] = length
                    else:
                        others.add(key)
            if key in others:
                waiting[i] = key
        return waiting

    def waits_for(self, key: bytes) -> bool:
        return self.tree.claimed(key, self)

    def computed(self, request: int, end: int) -> None:
        """The first `end` tokens of request number `request` are in the tree: its document's claim ends if
        they hold it."""
        if self.claims:
            prefix = self.prefixes[request]
            if prefix is not None and self.claims.get(prefix[1], end + 1) <= end:
                del self.claims[prefix[1]]
                self.tree.release([prefix[1]], self)

    def pin(self, node: Node, fetch: Fetch) -> None:
        """Pin the node until `fetch` has run, or the job is done."""
        self.tree.pin(node)
        self.pins[id(fetch)] = node

    def unpin(self, fetch: Fetch) -> None:
        self._unpin(id(fetch))

    def _unpin(self, key: int) -> None:
        node = self.pins.pop(key, None)  # once, whichever thread comes first (dict.pop is atomic)
        if node is not None:
            self.tree.unpin(node)

    def release(self) -> None:
        for key in list(self.pins):
            self._unpin(key)
        if self.claims:
            claims, self.claims = list(self.claims), {}
            self.tree.release(claims, self)


def _chunked(root: RadixNode, budget: int) -> RadixNode:
    """The tree with every edge longer than `budget` cut into a chain of edges of at most `budget` tokens
    (in place): a long prompt is computed in chunks, each continuing the KV of the one before, so no
    forward pass is longer than the budget (its time and memory bounded; cancellation between them)."""
    for node in [root, *nodes(root)]:
        while len(node) > budget:
            tail = RadixNode(node.start + budget, node.end, node.rep, node.children, node.ends)
            node.end, node.children, node.ends = node.start + budget, [tail], []
            node = tail
    return root


def _shares(chain: int, children: list[RadixNode]) -> bool:
    """Whether children attend to a prefix of `chain` tokens computed in their own pass (copied before
    each of them, as a short resident run is: pass_rows.Packed) rather than to its KV in a later pass:
    when the copies are no more than the tokens of the children and of all below them. A preamble
    joins the documents below it; an anchor does not join its partners' short questions."""
    return chain * len(children) <= sum(child.tokens_below() for child in children)


def _roots(tree: ResidentTree | None, requests: Sequence[Request], members: list[int], hold: _Hold,
           documents: dict[bytes, Match]) -> list[tuple[RadixNode, "KV | Fetch | None"]]:
    """The first nodes to compute for these members of `requests`, with the KV they continue: one radix
    tree over those that continue the same resident prefix (or none), cut to what follows it. The tree
    nodes those prefixes end in are pinned (held by `hold`). A request continues at most all but its
    last token (its answer is read there), and as far as `_continued` says. `documents` holds the
    matches of document prefixes made already (`_Hold.claim`), pinned; the others are made here (all
    unpinned at the end)."""
    groups: dict[tuple, list[int]] = {}
    found: dict[tuple, tuple[int, Match | None]] = {}
    matched: dict[int, Match] = {}  # each match once, its node pinned until the groups' own pins hold it
    for i in members:
        request = requests[i]
        match = _match(tree, request, hold.prefixes[i], documents) if tree is not None else None
        if match is not None:
            matched[id(match)] = match
        length, segments = _continued(request, match.length if match is not None else 0)
        key = (length, *(s.key for s in request.segments[:segments])) if segments is not None \
            else (length, id(match.node))
        found.setdefault(key, (length, match))
        groups.setdefault(key, []).append(i)
    out: list[tuple[RadixNode, KV | Fetch | None]] = []
    for key, group in groups.items():
        length, match = found[key]
        kv = None
        if length:
            kv = Fetch(requests[group[0]].tokens(0, length))
            hold.pin(match.node, kv)
        root = collapse(build([requests[i] for i in group]))
        for node in nodes(root):
            node.rep, node.ends = group[node.rep], [group[i] for i in node.ends]
        todo = list(root.children)  # each continues the resident prefix: all its requests share it
        while todo:
            node = todo.pop()
            node.start = max(node.start, length)
            if len(node):
                out.append((node, kv))
            else:
                todo.extend(node.children)
    for match in {**matched, **{id(m): m for m in documents.values()}}.values():
        tree.unpin(match.node)
    return out


def _match(tree: ResidentTree, request: Request, prefix: tuple[int, bytes] | None,
           documents: dict[bytes, Match]) -> Match:
    """The request's longest resident prefix (all but its last token at most). Where the tree lacks part
    of its document prefix (`prefix`), that is the document's match, looked up once for all the requests
    reading the document (a join's partners). Every match made here has its node pinned once (`documents`'
    too: unpin them all)."""
    if prefix is not None:
        length, key = prefix
        if key not in documents:
            documents[key] = _document_match(tree, request, length)
        if documents[key].length < length:
            tree.count(len(request) - 1, documents[key].length)
            return documents[key]
    return tree.match(request.tokens(0, len(request)), len(request) - 1, fetch=False, pin=True, with_kv=False)


def _document_match(tree: ResidentTree, request: Request, length: int) -> Match:
    """The resident part of the request's first `length` tokens (its document prefix), pinned, not counted
    in the hit rate, nothing copied back or held."""
    return tree.match(request.tokens(0, length), counted=False, fetch=False, pin=True, with_kv=False)


@dataclass(eq=False)
class Fetch:
    """A resident prefix a job's requests continue, taken from the tree as late as it can be.

    A resident prefix some of a job's requests continue: its KV is taken from the tree when the first
    item continuing it joins a pass (copied back into the pool if the tree moved it to the host tier), not
    when the job starts, so a job holds no more of the pool than its passes read (its prefixes may be
    more than the pool holds). Its node is pinned until then: it stays in the tree."""

    ids: np.ndarray
    kv: KV | None = None

    def run(self, hold: "_Hold") -> KV:
        """The prefix's KV, all of it (copied back from a lower tier where the tree moved it since: its node
        was pinned, so it is there)."""
        if self.kv is None:
            match = hold.tree.match(self.ids, counted=False, promised=True)
            if match.length != len(self.ids):
                raise RuntimeError(f"a pinned prefix of {len(self.ids)} tokens came back as {match.length}")
            self.kv = match.kv
            hold.unpin(self)  # the job holds the run itself now
        return self.kv


PARTIAL_TOKENS = 64  # a resident prefix is continued past its last whole segment when it runs this far past it


def _continued(request: Request, length: int) -> tuple[int, int | None]:
    """How much of its resident prefix of `length` tokens a request continues, and in how many whole
    segments (None: part of the last). The prefix ends at a segment boundary (the preamble, a document,
    a question) unless it runs at least PARTIAL_TOKENS into the next segment (a long history shared by
    an agent's traces): a few tokens that the request shares with another's (documents' common first
    words) are computed again rather than continued, so the many requests continuing one segment
    continue one run (read once per pass for all of them, radix.worth_keeping) instead of one run
    each."""
    segments = bisect.bisect_right(request.offsets, length) - 1
    boundary = request.offsets[segments]
    return (length, None) if length - boundary >= PARTIAL_TOKENS else (boundary, segments)
