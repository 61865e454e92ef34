"""A static embedding model: a text's embedding is the mean of its tokens' vectors, L2-normalized.

- One vector per vocabulary entry (a safetensors file), looked up for each token of the text; no context,
  no attention, no length limit: a text of any length has an embedding.
- The tokens are the tokenizer's without special tokens; a text of no tokens (empty) has none (None).
- The embedded default is WordLlama's L2 "supercat" table (256 dimensions; embedded.WORDLLAMA).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable

import numpy as np
from tokenizers import Tokenizer

from quail.engine.errors import InvalidArgument

_DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": None}
POOLED_TOKENS = 1 << 16  # tokens whose vectors are gathered at once (64 MiB at 256 dimensions)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file: an 8-byte little-endian header size, a JSON header naming each
    tensor's dtype, shape and byte range, then the data."""
    data = path.read_bytes()
    (size,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + size])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise InvalidArgument(f"{path.name}: tensor {name} is {entry['dtype']}, not F16 or F32")
        start, end = entry["data_offsets"]
        out[name] = np.frombuffer(data, dtype, (end - start) // np.dtype(dtype).itemsize, 8 + size + start
                                  ).reshape(entry["shape"])
    return out


class StaticEmbedding:
    """Token vectors and their tokenizer; `embed` gives each text's mean vector, L2-normalized (float32)."""

    def __init__(self, name: str, vectors: np.ndarray, tokenizer: Tokenizer) -> None:
        self.name = name
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.tokenizer = tokenizer
        self.dims = self.vectors.shape[1]

    @classmethod
    def from_files(cls, name: str, weights: Path, tokenizer: Path) -> "StaticEmbedding":
        """The model of a safetensors file holding one (vocabulary, dims) tensor and a tokenizer.json."""
        tensors = read_safetensors(weights)
        if len(tensors) != 1:
            raise InvalidArgument(f"{weights.name} holds {len(tensors)} tensors, not one table of token vectors")
        return cls(name, next(iter(tensors.values())), Tokenizer.from_file(str(tokenizer)))

    def tokens(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's token ids (no special tokens), clipped to the table."""
        encoded = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)  # ids alone: no offsets
        return [np.minimum(np.asarray(e.ids, dtype=np.int64), len(self.vectors) - 1) for e in encoded]

    def embed_ids(self, rows: list[np.ndarray], stop: Callable[[], None] | None = None) -> list[np.ndarray | None]:
        """Each text's embedding from its token ids: their vectors' mean, L2-normalized (None: no tokens, or a
        mean of zero length); the rows of one length pooled together, POOLED_TOKENS tokens at a time, `stop`
        (raising to stop) run before each pool."""
        out: list[np.ndarray | None] = [None] * len(rows)
        by_length: dict[int, list[int]] = {}
        for k, ids in enumerate(rows):
            if len(ids):
                by_length.setdefault(len(ids), []).append(k)
        for length, members in by_length.items():
            step = max(1, POOLED_TOKENS // length)
            for first in range(0, len(members), step):
                if stop is not None:
                    stop()
                group = members[first:first + step]
                means = self.vectors[np.stack([rows[k] for k in group])].mean(axis=1)
                norms = np.linalg.norm(means, axis=1)
                for k, mean, norm in zip(group, means, norms):
                    out[k] = mean / norm if norm > 0 else None
        return out
