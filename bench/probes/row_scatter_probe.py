"""GPU probe: rows of keys (tokens, 8 heads, 128) in bf16 copied into a pool's slots by index, several ways.

For 2,048 and 16,384 tokens and slots in order, reversed or at random: torch's
`index_copy_` on bf16 rows, the same rows as int64 or int32 words (index_copy_
and index_put_), a plain slice copy (slots in order), and a gather of the kept
tokens followed by the copy. Each word copy is checked to land the same bits.
Writes row_scatter.json to --out: microseconds per call.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.probes.timing import timed_ms

POOL_SLOTS = 400_000
REPEATS = 50


def variants(tokens: int, kind: str) -> dict[str, float]:
    """Microseconds per call of each way to write `tokens` rows into slots of `kind` order."""
    pool = torch.empty(POOL_SLOTS, 8, 128, dtype=torch.bfloat16, device="cuda")
    rows = torch.randn(tokens, 8, 128, dtype=torch.bfloat16, device="cuda")
    computed = torch.randn(tokens + 2000, 8, 128, dtype=torch.bfloat16, device="cuda")
    kept = torch.sort(torch.randperm(tokens + 2000, device="cuda")[:tokens]).values
    slots = {"in order": torch.arange(1000, 1000 + tokens, device="cuda"),
             "reversed": torch.arange(1000 + tokens - 1, 999, -1, device="cuda"),
             "random": torch.randperm(POOL_SLOTS, device="cuda")[:tokens]}[kind]
    out = {"bf16 index_copy": timed_ms(lambda: pool.index_copy_(0, slots, rows), REPEATS)}
    for name, dtype in (("int64", torch.int64), ("int32", torch.int32)):
        words, row_words = pool.view(POOL_SLOTS, -1).view(dtype), rows.view(tokens, -1).view(dtype)
        pool.zero_()
        out[f"{name} index_copy"] = timed_ms(lambda: words.index_copy_(0, slots, row_words), REPEATS)
        assert torch.equal(pool[slots], rows), name
        out[f"{name} index_put"] = timed_ms(lambda: words.index_put_((slots,), row_words), REPEATS)
    if kind == "in order":
        out["slice copy"] = timed_ms(lambda: pool[1000:1000 + tokens].copy_(rows), REPEATS)
        out["gather into the slice"] = timed_ms(
            lambda: torch.index_select(computed, 0, kept, out=pool[1000:1000 + tokens]), REPEATS)
    out["gather, bf16 index_copy"] = timed_ms(
        lambda: pool.index_copy_(0, slots, computed.index_select(0, kept)), REPEATS)
    words = pool.view(POOL_SLOTS, -1).view(torch.int64)
    computed_words = computed.view(tokens + 2000, -1).view(torch.int64)
    out["gather, int64 index_copy"] = timed_ms(
        lambda: words.index_copy_(0, slots, computed_words.index_select(0, kept)), REPEATS)
    return {name: round(ms * 1000, 1) for name, ms in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = {f"{tokens} {kind}": variants(tokens, kind)
               for tokens in (2048, 16384) for kind in ("in order", "reversed", "random")}
    for name, figures in results.items():
        print(name, figures)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "row_scatter.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
