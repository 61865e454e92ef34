"""Text to token ids: HF `tokenizers` built from a GGUF vocabulary or read from a tokenizer.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from quail.engine.model.gguf_weights import GGUFVocab

_CONTROL = 3  # GGUF token type of control (special) tokens
# llama.cpp's pre-tokenizer names whose regex is GPT-2's with digits split one by one.
_DIGIT_SPLITTING = {"smollm", "starcoder", "refact", "codeshell", "command-r"}


class Tokenizer:
    """Encodes text without adding special tokens; special tokens in text are recognised."""

    def __init__(self, backend: HFTokenizer) -> None:
        self._backend = backend

    @classmethod
    def from_gguf_vocab(cls, vocab: GGUFVocab) -> "Tokenizer":
        """Byte-level BPE with the vocabulary, merges and special tokens a GGUF file holds."""
        if not vocab.merges:
            raise ValueError("only byte-level BPE GGUF vocabularies (with merges) are supported")
        ids = {tok: i for i, tok in enumerate(vocab.tokens)}
        merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
        backend = HFTokenizer(models.BPE(ids, merges, fuse_unk=False, byte_fallback=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if vocab.pre in _DIGIT_SPLITTING:
            backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        specials = [tok for tok, kind in zip(vocab.tokens, vocab.token_types) if kind == _CONTROL]
        backend.add_special_tokens(specials)
        return cls(backend)

    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        """A tokenizer.json as HF saves it."""
        return cls(HFTokenizer.from_file(str(path)))

    def to_json(self) -> str:
        """The tokenizer as HF's tokenizer.json holds it."""
        return self._backend.to_str()

    def save(self, path: str | Path) -> None:
        self._backend.save(str(path))

    def encode(self, text: str) -> np.ndarray:
        """Token ids of text as int32."""
        return np.asarray(self._backend.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of many texts, encoded in parallel (ids alone: no offsets)."""
        encodings = self._backend.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary by its text (None: no such token)."""
        return self._backend.token_to_id(token)

    def decode(self, ids) -> str:
        return self._backend.decode(list(map(int, ids)), skip_special_tokens=False)
