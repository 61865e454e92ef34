"""The model work of one query: its requests, what the runtime computed, and the ideal plan's work."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .radix import ideal_stats
from .requests import Request
from .stats import Stats


@dataclass
class QueryWork:
    """Filled as a query runs; `ideal()` is the least work for the same requests.

    stages: one entry per AI operator: rows in and out, provided and observed selectivity.
    """

    stats: Stats = field(default_factory=Stats)
    requests: list[Request] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)

    def ideal(self) -> Stats:
        """Each distinct prefix of all the query's prompts computed once (unlimited KV)."""
        return ideal_stats(self.requests)
