"""Structured output: a JSON schema compiled to a token-level grammar (llguidance) that masks each step's logits.

llguidance was measured against xgrammar for this (docs/runtime.md, "Generation"):
it needs no other package, and every value it let through parsed and
validated, where xgrammar let raw control characters into bounded strings.
Whitespace is compact (no spaces or newlines between tokens of JSON), so an
answer cannot run to its token limit on blanks. The planner checks schemas
(`compiled`) without loading torch, which only masking needs.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

from quail.engine.errors import InvalidArgument

if TYPE_CHECKING:
    import torch

_COMPACT = {"whitespace_flexible": False}


def compiled(schema: str) -> str:
    """The llguidance grammar of a JSON schema (its text); InvalidArgument when the schema is not one."""
    from llguidance import LLMatcher

    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=_COMPACT)
    except (ValueError, TypeError) as error:
        raise InvalidArgument(f"the response format is not a JSON schema llguidance accepts: {error}") from None
    problem = LLMatcher.validate_grammar(grammar)
    if problem:
        raise InvalidArgument(f"the response format is not a JSON schema llguidance accepts: {problem}")
    return grammar


KEPT_SCHEMAS = 64  # the most recently used schemas' grammars a runtime keeps (a dashboard sends the same again)


class GrammarTokens:
    """A model's vocabulary as llguidance reads it, and the grammars used last over it.

    A model's vocabulary as llguidance reads it (built once per runtime: about half a second), and the
    grammars of the KEPT_SCHEMAS schemas used last over it."""

    def __init__(self, tokenizer_json: str, vocab: int, end: int) -> None:
        from llguidance import LLTokenizer

        self.vocab = vocab
        self._tokenizer = LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=end)
        self._schemas: OrderedDict[str, Schema] = OrderedDict()
        self._lock = threading.Lock()

    def schema(self, schema: str) -> "Schema":
        """The schema's grammar over this vocabulary: compiled once while it is among the last used."""
        with self._lock:
            kept = self._schemas.pop(schema, None)
        kept = kept or Schema(self, compiled(schema), schema)
        with self._lock:
            self._schemas[schema] = kept
            while len(self._schemas) > KEPT_SCHEMAS:
                self._schemas.popitem(last=False)
        return kept


class Schema:
    """One JSON schema's grammar over a vocabulary: a matcher per sequence, and the tokens each may take next.

    A matcher stops after the token that completes the JSON value (`stopped`);
    `accepting` says whether what it consumed is a whole value.
    """

    def __init__(self, tokens: GrammarTokens, grammar: str, source: str) -> None:
        from llguidance import LLMatcher

        self.source = source  # the JSON schema compiled to `grammar`
        self.vocab = tokens.vocab
        self._template = LLMatcher(tokens._tokenizer, grammar, log_level=0)
        if self._template.is_error():
            raise InvalidArgument(f"the response format cannot be followed: {self._template.get_error()}")

    def matcher(self) -> Any:
        return self._template.deep_copy()

    def allowed(self, matchers: Sequence[Any], device: torch.device) -> torch.Tensor:
        """Which tokens each matcher may take next: a (matchers, vocab) boolean tensor on `device`."""
        import numpy as np
        import torch
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        bitmask = allocate_token_bitmask(len(matchers), self.vocab)
        for row, matcher in enumerate(matchers):
            fill_next_token_bitmask(matcher, bitmask, row)
        words = torch.from_numpy(np.ascontiguousarray(bitmask)).to(device)
        bits = (words[:, :, None] >> torch.arange(32, device=device, dtype=words.dtype)) & 1
        return bits.reshape(len(matchers), -1)[:, :self.vocab].bool()

    @staticmethod
    def take(matcher: Any, token: int) -> bool:
        """Consume a token; whether the matcher has stopped (the JSON value is complete)."""
        matcher.consume_token(token)
        return matcher.is_stopped()

    @staticmethod
    def accepting(matcher: Any) -> bool:
        return matcher.is_accepting()


def canonical(schema: Any) -> str:
    """A schema's compact JSON text, its keys in the order given (answers follow the properties' order)."""
    return json.dumps(schema, separators=(",", ":"))
