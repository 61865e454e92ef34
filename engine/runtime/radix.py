"""A radix tree over request prompts: each shared token prefix once, the plan for computing it once.

Built from the requests sorted so that shared prefixes are contiguous, and the
longest common prefix (LCP) of neighbours: the classic stack construction.
Prompts are never concatenated: requests are sorted by their segments' bytes and
compared segment by segment, equal segments (by content key) skipped whole.
That order keeps every shared prefix contiguous when requests sharing material
are cut into segments alike (one prompt layout does so); otherwise some sharing
across differently cut requests is missed. Answers never depend on the order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

from quail.engine.kv.token_prefix import common_length, common_start
from quail.engine.runtime.counters import Stats, causal_pairs
from quail.engine.runtime.requests import Request, Segment


@dataclass(eq=False)
class RadixNode:
    """An edge of tokens [start, end) of request `rep`'s prompt, below its parent's edge."""

    start: int
    end: int
    rep: int
    children: list["RadixNode"] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return self.end - self.start

    def tokens_below(self) -> int:
        """Tokens of this edge and of every edge below it."""
        return len(self) + sum(child.tokens_below() for child in self.children)


def common_prefix(a: Request, b: Request) -> int:
    """Length of the longest common token prefix of two prompts."""
    return _common_prefix(a, b, *_sort_keys([a, b]))


def _common_prefix(a: Request, b: Request, a_bytes: tuple[bytes, ...], b_bytes: tuple[bytes, ...]) -> int:
    """`common_prefix` of two prompts whose segments' bytes (`_sort_keys`) are given: the first segments that
    differ are compared as bytes (a token's bytes all equal or it is where they part)."""
    shared = 0
    for sa, sb, bytes_a, bytes_b in zip(a.segments, b.segments, a_bytes, b_bytes):
        if sa.key == sb.key:
            shared += len(sa)
            continue
        step = common_start(bytes_a, bytes_b) // sa.ids.itemsize
        shared += step
        if step == len(sa) or step == len(sb):  # one segment is a prefix of the other: compare on by token
            rest = common_length(a.tokens(shared, len(a)), b.tokens(shared, len(b)))
            shared += rest
        return shared
    return shared


def _sort_keys(requests: Sequence[Request]) -> list[tuple[bytes, ...]]:
    """Each request's segments as bytes; equal segments as one object, which tuples compare at once."""
    found: dict[bytes, bytes] = {}

    def as_bytes(segment: Segment) -> bytes:
        if segment.key not in found:
            found[segment.key] = segment.ids.tobytes()
        return found[segment.key]

    return [tuple(as_bytes(s) for s in request.segments) for request in requests]


def build(requests: Sequence[Request]) -> RadixNode:
    """The compressed trie of the prompts; `ends` lists the requests ending at each node."""
    root = RadixNode(0, 0, -1)
    keys = _sort_keys(requests)
    order = sorted(range(len(requests)), key=keys.__getitem__)
    stack = [root]
    previous: int | None = None
    for i in order:
        request = requests[i]
        length = len(request)
        shared = _common_prefix(requests[previous], request, keys[previous], keys[i]) if previous is not None else 0
        popped = None
        while stack[-1].end > shared:
            popped = stack.pop()
        top = stack[-1]
        if popped is not None and top.end < shared:
            middle = RadixNode(popped.start, shared, popped.rep, children=[popped])
            popped.start = shared
            top.children[top.children.index(popped)] = middle
            stack.append(middle)
            top = middle
        if length > shared:
            leaf = RadixNode(shared, length, i, ends=[i])
            top.children.append(leaf)
            stack.append(leaf)
        else:
            top.ends.append(i)
        previous = i
    return root


def worth_keeping(edge: int, children: list[RadixNode]) -> bool:
    """Whether children should continue from a prefix's KV rather than each recompute its last `edge`
    tokens (those after the nearest kept prefix above it, whose KV they continue either way).

    A prefix is kept when that edge is at least as long as the mean of its
    children's own edges: an anchor document before short questions, a long
    shared history, the preamble before documents; not the branch points
    within them (documents' common first words, partners' common first
    tokens after an anchor), which each child recomputes in a token or two
    more rather than continuing a row of its own. A long resident run costs
    its rows a second attention call and a merge; a short one is copied
    before each of its rows on the GPU (pass_rows.Packed), and runs in the
    same pass as them (tree_job._shares), so keeping it costs ~nothing and
    saves its tokens in every row.
    """
    return edge * len(children) >= sum(len(c) for c in children)


def collapse(root: RadixNode) -> RadixNode:
    """The tree with every prefix not worth keeping folded into its children's edges (in place)."""
    todo = [root]
    while todo:
        node = todo.pop()
        kept, queue = [], list(node.children)
        while queue:
            child = queue.pop()
            if child.children and not worth_keeping(len(child), child.children):
                if child.ends:
                    kept.append(RadixNode(child.start, child.end, child.ends[0], ends=list(child.ends)))
                for grandchild in child.children:
                    grandchild.start = child.start
                queue.extend(child.children)
            else:
                kept.append(child)
        node.children = kept
        todo.extend(kept)
    return root


def nodes(root: RadixNode) -> Iterator[RadixNode]:
    """Every node below the root."""
    todo = list(root.children)
    while todo:
        node = todo.pop()
        yield node
        todo.extend(node.children)


def ideal_stats(requests: Sequence[Request]) -> Stats:
    """The least work that answers every request with unlimited KV: each prefix computed once.

    fresh = Σ edge lengths; pairs = Σ q·c + T(q) per edge of q tokens over c
    resident; kv_written = tokens of edges others continue from; kv_read = Σ c.
    """
    stats = Stats(requests=len(requests), logical_tokens=sum(len(r) for r in requests))
    for node in nodes(build(requests)):
        q = len(node)
        stats.fresh_tokens += q
        stats.attention_pairs += causal_pairs(q, node.start)
        stats.kv_written += q if node.children else 0
        stats.kv_read += node.start
    return stats
