"""Categories answered by their names: a trie over the names' token ids, one request per branch point.

A name of several tokens is scored as the model would spell it, constrained to
the names: at each trie node where names part, the next token's probability
renormalized over the tokens that continue some name; a node with one way on
costs nothing. P(name) is the product along its path. Names that part at their
first token (the usual case) cost one request per row, as letters do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from quail.engine.errors import InvalidArgument


@dataclass
class Branch:
    """A trie node where names part: the path of tokens to it and, per next token, the names below."""

    path: tuple[int, ...]
    ways: dict[int, list[int]] = field(default_factory=dict)


def branches(spelled: list[list[int]]) -> list[Branch]:
    """The branch points of the names' token trie, root first (each name's ids non-empty)."""
    for i, ids in enumerate(spelled):
        for j, other in enumerate(spelled):
            if i != j and len(ids) <= len(other) and list(other[: len(ids)]) == list(ids):
                raise InvalidArgument("a category name that is the start of another cannot be answered by name")
    out: list[Branch] = []

    def visit(path: tuple[int, ...], names: list[int]) -> None:
        ways: dict[int, list[int]] = {}
        for n in names:
            if len(spelled[n]) > len(path):
                ways.setdefault(int(spelled[n][len(path)]), []).append(n)
        if len(ways) > 1:
            out.append(Branch(path, ways))
        for token, below in ways.items():
            if len(below) > 1:
                visit(path + (token,), below)

    visit((), list(range(len(spelled))))
    return out


def name_logprobs(found: list[Branch], answers: list[np.ndarray], count: int) -> np.ndarray:
    """log P(name) per name from each branch's log-probabilities over its ways (in `ways` order)."""
    out = np.zeros(count)
    for branch, logp in zip(found, answers):
        for k, below in enumerate(branch.ways.values()):
            out[below] += logp[k]
    return out
