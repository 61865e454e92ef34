"""KV of a run of tokens, as the runtime keeps it between forward passes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(eq=False)
class KV:
    """Keys and values per layer, each (tokens, kv_heads, head_dim): the packed layout of a forward pass."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def __len__(self) -> int:
        return self.keys[0].shape[0]

    def slice(self, start: int, end: int) -> "KV":
        return KV([k[start:end] for k in self.keys], [v[start:end] for v in self.values])

    @staticmethod
    def cat(parts: list["KV"]) -> "KV":
        """One run from consecutive runs (copies)."""
        if len(parts) == 1:
            return parts[0]
        return KV([torch.cat(ks) for ks in zip(*(p.keys for p in parts))],
                  [torch.cat(vs) for vs in zip(*(p.values for p in parts))])
