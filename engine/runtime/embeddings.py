"""The server's embedding model behind AI_EMBED and AI_SIMILARITY: loaded on first use, each text embedded once.

- The model: the embedded static one (model/static_embedding.py), loaded the first time a statement embeds
  a text, not at start (a server that never embeds never fetches it); or a decoder (decoder_embedding.py,
  `--embed-model`), loaded at start.
- Each text's embedding is kept by its token ids, across queries (and a short text's token ids by the
  text, so it is not tokenized again), the least recently used dropped past `max_bytes`: what is kept is
  counted as it weighs (vectors, token ids, texts, and ENTRY_BYTES of bookkeeping each): about 1.6 KiB for
  a text of a dozen words at 256 dimensions (1.5 KiB measured), about 4.7 KiB at 1,024, so the default
  keeps about 650,000 or 220,000 of them: a dashboard's semantic top-k over 100,000 rows stays warm.
- `counts()`: texts embedded (computed), found kept (cached), and NULL (skipped).
- A text of no tokens (empty) has no embedding: None.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from quail.engine.errors import InvalidArgument
from quail.engine.model.embedded import WORD_EMBEDDINGS, WORD_TOKENIZER, WORDLLAMA
from quail.engine.model.static_embedding import StaticEmbedding
from quail.engine.runtime.query_work import Works

EMBEDDED_NAME, EMBEDDED_DIMS = "wordllama-l2-supercat-256", 256
MAX_BYTES = 1 << 30  # embeddings (and texts' token ids) kept across queries
ENTRY_BYTES = 200  # what keeping an entry costs beyond its vector, token ids or text: dict slot, object headers
KEYED_CHARS = 1024  # texts up to this long keep their token ids by their text (longer ones are tokenized again)


@dataclass(frozen=True)
class EmbeddingCounts:
    """Texts embedded (computed), found kept (cached), and NULL (skipped)."""

    computed: int = 0
    cached: int = 0
    skipped: int = 0

    def minus(self, before: EmbeddingCounts) -> EmbeddingCounts:
        return EmbeddingCounts(self.computed - before.computed, self.cached - before.cached,
                               self.skipped - before.skipped)


class EmbeddingModel(Protocol):
    """What embeds texts: a name, dimensions, token ids of texts, and embeddings of token ids (None: none)."""

    name: str
    dims: int

    def tokens(self, texts: list[str]) -> list[np.ndarray]: ...

    def embed_ids(self, rows: list[np.ndarray], stop: Callable[[], None] | None = None) -> list[np.ndarray | None]:
        ...


def embedded_model() -> StaticEmbedding:
    """The embedded default: WordLlama's L2 supercat table, 256 dimensions (fetched once: embedded.py)."""
    files = WORDLLAMA.files()
    return StaticEmbedding.from_files(EMBEDDED_NAME, files[WORD_EMBEDDINGS], files[WORD_TOKENIZER])


class Embeddings:
    """An embedding model of `dims` dimensions, loaded by `load` on first use, and the embeddings it gave.

    - `device`: where a similarity join's matrix products run (engine/exec/similar_pairs.py).
    - `works`: the work of the statements under way, by the keys their similarity joins' functions are
      given (query_work.Works).
    """

    def __init__(self, load: Callable[[], EmbeddingModel] = embedded_model, name: str = EMBEDDED_NAME,
                 dims: int = EMBEDDED_DIMS, max_bytes: int = MAX_BYTES, names: Sequence[str] = (),
                 device: str = "cpu") -> None:
        self.name, self.dims, self.device = name, dims, device  # the device: where similarity joins multiply
        self.names = frozenset({name.lower(), "default", *(n.lower() for n in names)})
        self.works = Works()
        self._load = load
        self._model: EmbeddingModel | None = None
        self._kept: OrderedDict[bytes, np.ndarray | None] = OrderedDict()  # by token ids
        self._keys: OrderedDict[str, bytes] = OrderedDict()  # each short text's token ids
        self._max_bytes, self._used = max_bytes, 0
        self._lock = threading.Lock()
        self.computed = 0
        self.cached = 0
        self.skipped = 0

    def model(self) -> EmbeddingModel:
        """The model, loaded now if it is not yet (what loading raises, a missing download's NotFound say)."""
        with self._lock:
            if self._model is None:
                model = self._load()
                if model.dims != self.dims:
                    raise InvalidArgument(f"the embedding model {self.name} gives {model.dims} dimensions, "
                                          f"not {self.dims}")
                self._model = model
            return self._model

    def check_model(self, name: str) -> None:
        """InvalidArgument unless `name` names this model (its name or 'default')."""
        if name.lower() not in self.names:
            raise InvalidArgument(f"AI_EMBED's model {name!r} is not the embedding model served: use "
                                  f"{self.name!r} or 'default'")

    def counts(self) -> EmbeddingCounts:
        """Texts embedded, found kept, and NULL, so far."""
        with self._lock:
            return EmbeddingCounts(self.computed, self.cached, self.skipped)

    def embed(self, texts: Sequence[str | None], stop: Callable[[], None] | None = None) -> list[np.ndarray | None]:
        """Each text's embedding (float32, L2-normalized; None for None, and for a text of no tokens); a text seen
        before is not tokenized again while its embedding is kept. `stop` (the statement's check: it raises to
        stop) runs between the model's passes."""
        model = self.model()
        present = [k for k, text in enumerate(texts) if text is not None]
        with self._lock:
            keys = {k: self._keys[texts[k]] for k in present if self._keys.get(texts[k]) in self._kept}
        unseen = [k for k in present if k not in keys]
        tokens = dict(zip(unseen, model.tokens([texts[k] for k in unseen])))
        keys.update((k, row.tobytes()) for k, row in tokens.items())
        with self._lock:
            missing = {keys[k]: row for k, row in tokens.items() if keys[k] not in self._kept}
        computed = dict(zip(missing, model.embed_ids(list(missing.values()), stop)))  # each distinct text once
        with self._lock:
            for key, vector in computed.items():
                if key not in self._kept:
                    self._used += _kept_bytes(key, vector)
                self._kept[key] = vector
            out = [self._kept.get(keys[k]) if k in keys else None for k in range(len(texts))]
            for k in present:
                if keys[k] in self._kept:
                    self._kept.move_to_end(keys[k])
                if len(texts[k]) <= KEYED_CHARS:
                    if texts[k] not in self._keys:
                        self._used += _keyed_bytes(texts[k])
                    self._keys[texts[k]] = keys[k]
                    self._keys.move_to_end(texts[k])
            self._trim()
            self.computed += len(computed)
            self.cached += len(present) - len(computed)
            self.skipped += len(texts) - len(present)
        return out

    def _trim(self) -> None:
        """Drop the least recently used until what is kept weighs at most max_bytes: a text's token ids first
        while texts outnumber the embeddings kept (several may share one), else an embedding (lock held)."""
        while self._used > self._max_bytes and (self._kept or self._keys):
            if self._keys and len(self._keys) >= len(self._kept):
                text, _ = self._keys.popitem(last=False)
                self._used -= _keyed_bytes(text)
            else:
                key, vector = self._kept.popitem(last=False)
                self._used -= _kept_bytes(key, vector)


def _kept_bytes(key: bytes, vector: np.ndarray | None) -> int:
    """What keeping an embedding by its token ids weighs."""
    return len(key) + (vector.nbytes if vector is not None else 0) + ENTRY_BYTES


def _keyed_bytes(text: str) -> int:
    """What keeping a text's token ids by the text weighs (the ids themselves are the embedding's key)."""
    return len(text) + ENTRY_BYTES
