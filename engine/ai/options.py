"""What a generating AI step asks beyond its prompt (AI_COMPLETE's options, an AI aggregate's).

Plan facts, checked when planned, with nothing of the runtime's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from quail.engine.errors import InvalidArgument
from quail.engine.runtime.grammar import compiled

DEFAULT_MAX_TOKENS = 256  # a row's answer, when the query sets no max_tokens
MAX_STOP_TEXTS = 16  # stop texts a call may name (each is looked for after every token generated)
MAX_STOP_BYTES = 256  # the longest stop text, in UTF-8 bytes


@dataclass(frozen=True)
class Generation:
    """What a generating call asks beyond its prompt.

    At most `max_tokens` tokens a row, up to the token that closes the model's
    turn or the first of the `stop` texts (the answer is cut before it);
    `temperature` 0 answers greedily (deterministic), above 0 draws each token
    (within the `top_p` nucleus) with randomness fixed by the prompt, so the
    same prompt gets the same answer. `model`: the model the query names
    (Snowflake's first argument), which must be the one served; None names it.
    `schema`: a JSON schema's text (grammar.canonical): the answer is JSON
    that follows it, and the prompt says so.
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    model: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        if self.schema is not None:
            compiled(self.schema)
        if self.max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be at least 1, not {self.max_tokens}")
        if not 0 <= self.temperature <= 2:
            raise InvalidArgument(f"temperature must be in [0, 2], not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidArgument(f"top_p must be in (0, 1], not {self.top_p}")
        if any(not text for text in self.stop):
            raise InvalidArgument("a stop text must not be empty")
        if len(self.stop) > MAX_STOP_TEXTS:
            raise InvalidArgument(f"at most {MAX_STOP_TEXTS} stop texts, not {len(self.stop):,}")
        if any(len(text.encode()) > MAX_STOP_BYTES for text in self.stop):
            raise InvalidArgument(f"a stop text is at most {MAX_STOP_BYTES} bytes (UTF-8)")

    def describe(self) -> str:
        """EXPLAIN's words: how many tokens a row at most, and how they are chosen."""
        chosen = "greedy" if self.temperature == 0 else f"temperature {self.temperature:g}, top_p {self.top_p:g}"
        stop = f", stop {list(self.stop)}" if self.stop else ""
        schema = ", JSON following its schema" if self.schema else ""
        return f"at most {self.max_tokens:,} tokens a row, {chosen}{stop}{schema}"

    def to_json(self) -> str:
        """The options as a JSON object (Substrait plans carry them so)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Generation":
        """The options of a JSON object as `to_json` writes it (InvalidArgument for anything else)."""
        try:
            values = json.loads(text)
            known = {f.name for f in fields(cls)}
            if not isinstance(values, dict) or not set(values) <= known:
                raise ValueError(f"an object of {', '.join(sorted(known))}")
            return cls(**{k: tuple(v) if k == "stop" else v for k, v in values.items()})
        except (ValueError, TypeError) as error:
            raise InvalidArgument(f"generation options must be {error}") from None


SUMMARIZE = "Summarize the texts in a few sentences."  # AI_SUMMARIZE_AGG's instruction


@dataclass(frozen=True)
class Aggregation:
    """An AI aggregate: its instruction, its generation options, how many texts a prompt takes.

    An AI aggregate: the instruction each prompt states, how answers are generated, and the most texts a
    prompt takes (None: as many as fit the context)."""

    instruction: str
    generation: Generation
    fan_in: int | None = None

    def describe(self) -> str:
        fan_in = f"at most {self.fan_in} texts" if self.fan_in else "as many texts as fit"
        return f"{self.instruction!r}, {fan_in} a prompt, {self.generation.describe()}"
