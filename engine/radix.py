"""A radix tree over token sequences: each shared prefix once, the plan for computing it once.

Built from the sequences sorted so that every shared prefix is contiguous, and
the longest common prefix (LCP) of neighbours: the classic stack construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .stats import Stats, causal_pairs


@dataclass(eq=False)
class RadixNode:
    """An edge of tokens [start, end) of sequence `rep`, below its parent's edge."""

    start: int
    end: int
    rep: int
    children: list["RadixNode"] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return self.end - self.start


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def build(seqs: Sequence[np.ndarray]) -> RadixNode:
    """The compressed trie of the sequences; `ends` lists the sequences ending at each node."""
    root = RadixNode(0, 0, -1)
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].tobytes())
    stack = [root]
    previous: np.ndarray | None = None
    for i in order:
        seq = seqs[i]
        shared = common_prefix(previous, seq) if previous is not None else 0
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
        if len(seq) > shared:
            leaf = RadixNode(shared, len(seq), i, ends=[i])
            top.children.append(leaf)
            stack.append(leaf)
        else:
            top.ends.append(i)
        previous = seq
    return root


def nodes(root: RadixNode) -> Iterator[tuple[RadixNode, int]]:
    """Every node below the root with the depth its edge starts at."""
    todo = [(child, 0) for child in root.children]
    while todo:
        node, _ = todo.pop()
        yield node, node.start
        todo.extend((child, node.end) for child in node.children)


def ideal_stats(seqs: Sequence[np.ndarray]) -> Stats:
    """The least work that answers every sequence with unlimited KV: each prefix computed once.

    fresh = Σ edge lengths; pairs = Σ q·c + T(q) per edge of q tokens over c
    resident; kv_written = tokens of edges others continue from; kv_read = Σ c.
    """
    stats = Stats(requests=len(seqs), logical_tokens=int(sum(len(s) for s in seqs)))
    for node, depth in nodes(build(seqs)):
        q = len(node)
        stats.fresh_tokens += q
        stats.attention_pairs += causal_pairs(q, depth)
        stats.kv_written += q if node.children else 0
        stats.kv_read += depth
    return stats
