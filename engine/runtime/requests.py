"""The runtime's request API: token segments, label sets, requests, and what the planner may ask of the pool.

Segments are token ids with content keys.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Segment:
    """A run of token ids; `key` names its content for one model, so equal segments share KV."""

    ids: np.ndarray = field(repr=False)
    key: bytes

    @classmethod
    def of(cls, ids: np.ndarray, model_id: str) -> "Segment":
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        digest = hashlib.blake2b(ids.tobytes(), digest_size=16, person=model_id.encode()[:16])
        return cls(ids, digest.digest())

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class LabelSet:
    """The answers a decision chooses between, each spelled by one or more single tokens.

    `token_ids[i]` belongs to answer `groups[i]`; the head is cut to `token_ids`.
    """

    names: tuple[str, ...]
    token_ids: tuple[int, ...]
    groups: tuple[int, ...]


@dataclass(frozen=True)
class Request:
    """One model decision: the concatenated segments, scored over a label set."""

    segments: tuple[Segment, ...]
    labels: LabelSet
    offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)  # each segment's first token, then the end

    def __post_init__(self) -> None:
        segments = self.segments  # one segment (a text to embed: 100,000 a top-k) skips the accumulation
        offsets = (0, len(segments[0].ids)) if len(segments) == 1 else \
            tuple(itertools.accumulate((len(s.ids) for s in segments), initial=0))
        object.__setattr__(self, "offsets", offsets)

    def ids(self) -> np.ndarray:
        """The prompt's token ids (a single segment's own array: read, never written)."""
        if len(self.segments) == 1:
            return self.segments[0].ids
        return np.concatenate([s.ids for s in self.segments])

    def prefix(self, segments: int) -> tuple[int, bytes]:
        """Length and content key of the first `segments` segments."""
        head = self.segments[:segments]
        return self.offsets[len(head)], segments_key(head)

    def tokens(self, start: int, end: int) -> np.ndarray:
        """ids()[start:end] without concatenating the whole prompt."""
        parts = []
        for segment, first, last in zip(self.segments, self.offsets, self.offsets[1:]):
            if first >= end:
                break
            if last > start:
                parts.append(segment.ids[max(start - first, 0) : min(end, last) - first])
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)

    def __len__(self) -> int:
        return self.offsets[-1]


DOCUMENT_PREFIX = 2  # segments kept: the preamble and the first document (or join anchor)


def segments_key(segments: Sequence[Segment]) -> bytes:
    """The content key of segments laid end to end (Request.prefix)."""
    return hashlib.blake2b(b"".join(s.key for s in segments), digest_size=16).digest()


def document_prefix(request: Request) -> tuple[int, bytes] | None:
    """Length and content key of a request's [preamble][first document] (None: nothing follows them)."""
    return request.prefix(DOCUMENT_PREFIX) if len(request.segments) > DOCUMENT_PREFIX else None


class ResidentShare(Protocol):
    """What the planner may ask of the KV pool: a column's documents' resident share.

    What the planner may ask of the KV pool (Runtime.resident_share): of the documents a column's texts make
    as placeholder {placeholder}'s, the share of their tokens whose whole document prefix ([preamble][document],
    what every request over them begins with) is resident now, from 0 to 1."""

    def __call__(self, texts: pa.Array | pa.ChunkedArray, placeholder: int) -> float: ...
