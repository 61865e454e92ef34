"""Work counters of scoring: what a query asked for and what the runtime computed."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Stats:
    """Counts accumulated over one query (or one benchmark run).

    logical_tokens: every request's full prompt length, as a naive engine sees it.
    fresh_tokens: real tokens computed; padded_tokens: padding computed through the
    linear layers beside them (padded baselines only: the runner packs its rows).
    attention_pairs: (query, key) pairs scored; kv_written: KV rows kept for later
    requests; kv_read: resident KV rows read by later computation; planned_tokens:
    the fresh tokens the strategies have laid out for the requests handed to them
    so far (progress: fresh_tokens of planned_tokens); generated_tokens: tokens
    decoding chose (counted in logical_tokens too: their own KV is computed in later passes);
    decoded_tokens: the tokens decoding computed, counted in fresh_tokens too (each sequence's chosen
    tokens fed back, the rest of a prompt the resident tree let go of between its prefill and its
    decoding, a token that ended its sequence computed before it was read); decode_steps: forward
    passes that carried sequences being decoded; host_restored_tokens, disk_restored_tokens: resident
    tokens copied back into the pool from the host tier and from the disk tier (counted cached).
    """

    requests: int = 0
    logical_tokens: int = 0
    fresh_tokens: int = 0
    padded_tokens: int = 0
    attention_pairs: int = 0
    kv_written: int = 0
    kv_read: int = 0
    forward_passes: int = 0
    planned_tokens: int = 0
    generated_tokens: int = 0
    decoded_tokens: int = 0
    decode_steps: int = 0
    host_restored_tokens: int = 0
    disk_restored_tokens: int = 0

    @property
    def physical_tokens(self) -> int:
        """Tokens through the linear layers, padding included."""
        return self.fresh_tokens + self.padded_tokens

    @property
    def prompt_tokens(self) -> int:
        """Logical tokens of the prompts: what was asked, without what decoding generated."""
        return self.logical_tokens - self.generated_tokens

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens not computed (served from resident KV, or shared with an identical request's): the
        prompts' tokens less those their prefill computed, what decoding computed apart."""
        return self.prompt_tokens - (self.fresh_tokens - self.decoded_tokens)

    def plus(self, other: "Stats") -> "Stats":
        """Both counts added, field by field."""
        return Stats(*(getattr(self, name) + getattr(other, name) for name in _NAMES))

    def minus(self, other: "Stats") -> "Stats":
        """The counts added since `other` (an earlier copy of these), field by field."""
        return Stats(*(getattr(self, name) - getattr(other, name) for name in _NAMES))

    def as_dict(self) -> dict[str, int]:
        return {**{name: getattr(self, name) for name in _NAMES}, "physical_tokens": self.physical_tokens, "cached_tokens": self.cached_tokens}


_NAMES = tuple(f.name for f in fields(Stats))  # the counts, in field order


def causal_pairs(q: int, c: int = 0) -> int:
    """Attention pairs of q new tokens over c resident ones: q·c + q(q+1)/2."""
    return q * c + q * (q + 1) // 2
