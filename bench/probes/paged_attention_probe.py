"""GPU probe: attention to KV held in the pool, read in place through slot tables or gathered first (H200).

Rows that continue resident runs (a document asked a new question, a join's
anchor) attend to keys scattered over the device pool's token slots. Three
ways to read them, on pass shapes of the shared server and the joins
(Qwen3-4B attention: 32/8 heads, d=128, bf16; slots drawn at random from a
pool of 262,144):
- `gather`: one index_select per layer lays the runs' keys end to end, then our
  Triton kernel (engine/kernels/attention_triton.py) reads them (shipped before);
- `paged`: the same kernel reads each key through the slot table (a page a token);
- `flashinfer`: FlashInfer's BatchPrefillWithPagedKVCacheWrapper over the same
  table (page_size 1, non-causal, with LSE), runs only; where it installs (its
  JIT kernels compile on first use; the compile time is reported).
Each shape is timed with each run's slots contiguous (as a pool hands out
slots taken together) and scattered at random (after churn), runs only
(queries over their runs) and, for ours, with the rows' own tokens too (one
call: runs then own keys, causal); paged reads with several launch settings.
Per variant: mean milliseconds a layer, and its largest difference from
`gather` (paged) or its relative error against it (flashinfer). Writes paged-attention.json to --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from quail.engine.kernels import attention_triton as attention_kernels
from quail.engine.kernels.pass_rows import QUERY_BLOCK, query_blocks

from .timing import timed_ms

H, HKV, D, POOL = 32, 8, 128, 1 << 18
SHAPES = {  # name: (runs, keys a run, rows a run, new tokens a row)
    "refresh_640x300": (640, 300, 1, 6),
    "new_question_640x300": (640, 300, 1, 24),
    "join_90x300": (90, 300, 12, 15),
    "anchor_2x2500": (2, 2500, 100, 25),
}
LAYOUTS = ("contiguous", "random")
PAGED_LAUNCH = ((64, 2), (64, 3), (64, 4), (32, 3))  # (keys a step, pipeline stages) of the paged reads


def _cuda(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _slots(runs: int, keys: int, layout: str, rng: np.random.Generator) -> np.ndarray:
    """The runs' slots end to end: each run a contiguous range at a random place (as a pool hands out
    slots taken together), or every slot anywhere (a pool after much churn)."""
    if layout == "random":
        return rng.choice(POOL, size=runs * keys, replace=False).astype(np.int64)
    starts = rng.permutation(POOL // keys)[:runs] * keys
    return (starts[:, None] + np.arange(keys)[None, :]).reshape(-1).astype(np.int64)


def _case(runs: int, keys: int, rows: int, new: int, layout: str, rng: np.random.Generator) -> dict:
    """The kernel's inputs for `runs` runs of `keys` slots, each continued by `rows` rows of `new` tokens."""
    slots = _slots(runs, keys, layout, rng)
    per_run = rows * new
    tokens = runs * per_run
    run_q = np.arange(runs + 1, dtype=np.int32) * per_run
    cu_r = np.arange(runs + 1, dtype=np.int32) * keys
    lengths = [new] * (runs * rows)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return {"tokens": tokens, "slots": _cuda(slots), "slots32": _cuda(slots.astype(np.int32)),
            "cu_r": _cuda(cu_r), "run_q": _cuda(run_q),
            "blocks": _cuda(query_blocks([(run_q[i], run_q[i + 1], i) for i in range(runs)], QUERY_BLOCK)),
            "own": (_cuda(cu), _cuda(np.repeat(np.arange(len(lengths), dtype=np.int32), lengths))),
            "q": torch.randn(tokens, H, D, device="cuda", dtype=torch.bfloat16),
            "k": torch.randn(tokens, HKV, D, device="cuda", dtype=torch.bfloat16),
            "v": torch.randn(tokens, HKV, D, device="cuda", dtype=torch.bfloat16)}


def _ours(c: dict, pool_k: torch.Tensor, pool_v: torch.Tensor, paged: bool, own: bool, block_n: int = 64,
          **launch: int) -> tuple[torch.Tensor, ...]:
    if paged:
        runs, table = (pool_k, pool_v, c["cu_r"]), c["slots"]
    else:
        runs, table = (pool_k.index_select(0, c["slots"]), pool_v.index_select(0, c["slots"]), c["cu_r"]), None
    cu, q_rows = c["own"]
    mine = (c["k"], c["v"], cu, cu, q_rows) if own else None
    return attention_kernels.packed_attention(c["q"], c["blocks"], QUERY_BLOCK, mine, runs, table, block_n, **launch)


def _flashinfer(c: dict, pool_k: torch.Tensor, pool_v: torch.Tensor, result: dict):
    """A FlashInfer wrapper planned for the case's runs, or None (the reason in result['flashinfer'])."""
    try:
        import flashinfer
    except Exception as e:  # noqa: BLE001 - any import failure is a finding to report
        result["flashinfer"] = f"not importable: {type(e).__name__}: {e}"
        return None
    result["flashinfer"] = getattr(flashinfer, "__version__", "?")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), kv_layout="NHD")
    runs = len(c["cu_r"]) - 1
    start = time.perf_counter()
    wrapper.plan(c["run_q"], c["cu_r"], c["slots32"], torch.ones(runs, dtype=torch.int32, device="cuda"),
                 H, HKV, D, 1, causal=False, q_data_type=torch.bfloat16)
    torch.cuda.synchronize()
    plan_ms = (time.perf_counter() - start) * 1e3
    cache = (pool_k.view(POOL, 1, HKV, D), pool_v.view(POOL, 1, HKV, D))
    return wrapper, cache, plan_ms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--no-flashinfer", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    pool_k, pool_v = (torch.randn(POOL, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "pool_slots": POOL,
                    "shapes": {}}
    out = Path(args.out, "paged-attention.json")
    for (name, shape), layout in itertools.product(SHAPES.items(), LAYOUTS):
        c = _case(*shape, layout, rng)
        row: dict = {"runs, keys, rows, new": shape, "slots": layout, "query_tokens": c["tokens"]}
        for own in (False, True):
            tag = "with_own" if own else "runs_only"
            want = _ours(c, pool_k, pool_v, False, own)
            row[f"{tag}_gather_ms"] = timed_ms(lambda: _ours(c, pool_k, pool_v, False, own))
            for block_n, stages in PAGED_LAUNCH:
                got = _ours(c, pool_k, pool_v, True, own, block_n, num_stages=stages)
                key = f"{tag}_paged_n{block_n}_s{stages}"
                row[f"{key}_max_abs_diff"] = float((got[0].float() - want[0].float()).abs().max())
                row[f"{key}_ms"] = timed_ms(lambda: _ours(c, pool_k, pool_v, True, own, block_n, num_stages=stages))
        row["gather_alone_ms"] = timed_ms(lambda: (pool_k.index_select(0, c["slots"]),
                                                   pool_v.index_select(0, c["slots"])))
        result["shapes"][f"{name}_{layout}"] = row
        print(name, json.dumps(row), flush=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if args.no_flashinfer:
        return
    for name, shape in SHAPES.items():
        c = _case(*shape, "random", rng)
        row = result["shapes"][f"{name}_random"]
        try:
            start = time.perf_counter()
            made = _flashinfer(c, pool_k, pool_v, result)
            if made is None:
                break
            wrapper, cache, plan_ms = made
            fi_out, fi_lse = wrapper.run(c["q"], cache, return_lse=True)
            torch.cuda.synchronize()
            row["flashinfer_first_call_s"] = time.perf_counter() - start
            want, want_lse = _ours(c, pool_k, pool_v, True, False)
            row["flashinfer_rel_err"] = float((fi_out.float() - want.float()).norm() / want.float().norm())
            row["flashinfer_lse_max_abs_diff_natural"] = float((fi_lse.float() - want_lse).abs().max())
            row["flashinfer_lse_max_abs_diff_log2"] = float((fi_lse.float() * 0.6931471805599453 - want_lse).abs().max())
            row["flashinfer_plan_ms"] = plan_ms
            row["flashinfer_runs_only_ms"] = timed_ms(lambda: wrapper.run(c["q"], cache, return_lse=True))
        except Exception:  # noqa: BLE001 - a failed candidate is a finding to report
            row["flashinfer_error"] = traceback.format_exc()[-2000:]
        print(name, json.dumps({k: v for k, v in row.items() if "flashinfer" in k})[:3000], flush=True)
        out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
