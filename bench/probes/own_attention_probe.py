"""GPU probe: kernels for rows attending causally to their own tokens, packed without padding (H200).

Flash varlen (FA2, shipped until our Triton kernel replaced it) spends ~0.5 ms a
layer on F1's passes (16K tokens of ~330-token rows): ~100 TFLOP/s. Candidates,
each on several F1-like pass compositions (new shapes every time, as a query
brings them): its first call and warm calls in milliseconds, TFLOP/s of useful
(causal) work, and its error against an fp32 reference on sample rows:
- `flash`: torch's FA2 varlen (`_flash_attention_forward`);
- `cudnn`: cuDNN over the same packed rows (`_cudnn_attention_forward` with
  cumulative offsets: ragged, no padding);
- `flex`: FlexAttention with a document mask (compiled Triton);
- `triton64`, `triton128`: our Triton kernel (engine/kernels/attention_triton.py) with
  64 or 128 queries a program; `triton:M:N:W:S[:heavy]` the same with M queries
  and N keys a step, W warps, S pipeline stages, the blocks with the most keys
  first where `heavy`; `--sweep` adds every such setting;
- `fa4`: flash-attn-4 (CuTe DSL, sm90 forward) through torch's FA4 registration,
  where its wheels were carried.
`--mean` and `--heads` set the rows' mean length and the model's q and kv heads
(an embedding model's short texts: `--mean 134 --heads 16,8`).
Run once plainly and once with TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 (cuDNN then
builds one plan for many shapes). Writes own-attention[-avoid-recompile].json to --out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import torch

D = 128
WARM_CALLS = 20


def compositions(count: int, mean: float = 330, budget: int = 16384, seed: int = 0) -> list[list[int]]:
    """Row lengths of `count` passes: lognormal around `mean` tokens (sigma 0.4: F1's reviews at 330,
    BIG's reports at 2,500), up to the budget."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        lengths = np.maximum(8, rng.lognormal(np.log(mean) - 0.08, 0.4, 100).astype(int))
        out.append(lengths[np.cumsum(lengths) <= budget].tolist())
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One row, fp32: q (n, heads, D), k/v (m ≥ n, kv heads, D) → causal attention aligned bottom-right (query i
    sees keys up to m − n + i): (n, heads, D)."""
    k, v = (t.float().repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(0, 1) for t in (k, v))
    scores = (q.float().transpose(0, 1) @ k.transpose(-1, -2)) * D ** -0.5
    n, m = q.shape[0], k.shape[1]
    allowed = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
    return (torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v).transpose(0, 1)


def flash(q, k, v, cu_q, cu_k, max_q, max_k):
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False,
                                                   scale=D ** -0.5)[0]


def cudnn(q, k, v, cu_q, cu_k, max_q, max_k):
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu_q, cu_k, max_q, max_k, True, 0.0, True,
                                                   False, scale=D ** -0.5)[0]


def flex_kernel() -> Callable:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v, cu_q, cu_k, max_q, max_k):
        rows = torch.arange(len(cu_q) - 1, device=q.device)
        doc_q = torch.repeat_interleave(rows, cu_q[1:] - cu_q[:-1])
        doc_k = torch.repeat_interleave(rows, cu_k[1:] - cu_k[:-1])
        shift = (cu_k[1:] - cu_k[:-1]) - (cu_q[1:] - cu_q[:-1])  # keys before each row's first query

        def causal_in_row(b, h, qi, ki):
            row = doc_q[qi]
            return (row == doc_k[ki]) & (ki - cu_k[row] <= qi - cu_q[row] + shift[row])

        mask = create_block_mask(causal_in_row, None, None, q.shape[0], k.shape[0], device=q.device)
        out = compiled(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                       block_mask=mask, enable_gqa=True, scale=D ** -0.5)
        return out[0].transpose(0, 1)

    return run


def triton_kernel(block: int, block_n: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None, heavy_first: bool = False) -> Callable:
    """Our kernel; settings left None are the shipped ones. heavy_first: blocks ordered by the keys
    their last query sees, most first (the tail of the launch then holds the short blocks)."""
    from quail.engine.kernels.pass_rows import query_blocks
    from quail.engine.kernels.attention_triton import packed_attention

    settings = {name: value for name, value in
                (("block_n", block_n), ("num_warps", num_warps), ("num_stages", num_stages)) if value is not None}
    tables: dict[int, tuple[torch.Tensor, ...]] = {}  # per offsets tensor (held: its id stays its own), off the clock

    def run(q, k, v, cu_q, cu_k, max_q, max_k):
        if id(cu_q) not in tables:
            starts = cu_q.cpu().numpy()
            spans = [(a, e, -1) for a, e in zip(starts[:-1], starts[1:])]
            rows = np.repeat(np.arange(len(spans)), np.diff(starts)).astype(np.int32)
            blocks = query_blocks(spans, block)
            if heavy_first:
                ends = blocks[:, 0] + blocks[:, 1]
                blocks = blocks[np.argsort(-(ends - starts[rows[blocks[:, 0]]]), kind="stable")]
            tables[id(cu_q)] = (cu_q, torch.from_numpy(blocks).cuda(), torch.from_numpy(rows).cuda())
        _, blocks, rows = tables[id(cu_q)]
        return packed_attention(q, blocks, block, (k, v, cu_q, cu_k, rows), **settings)[0]

    return run


def fa4_kernel() -> Callable:
    from torch.nn.attention import activate_flash_attention_impl

    importlib.import_module("torch.nn.attention._fa4")  # registers "FA4"; needs the flash-attn-4 wheels
    activate_flash_attention_impl("FA4")
    return flash


def timed(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start), out


def _inputs(lengths: list[int], before: int, heads: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """Packed q, k, v and offsets of rows of `lengths` queries, each after `before` extra keys; heads: q's
    and the keys'."""
    keys = [n + before for n in lengths]
    q = torch.randn(sum(lengths), heads[0], D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(keys), heads[1], D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu_q, cu_k = (torch.tensor(np.concatenate([[0], np.cumsum(x)]), dtype=torch.int32, device="cuda")
                  for x in (lengths, keys))
    return q, k, v, cu_q, cu_k


def _errors(out, q, k, v, cu_q, cu_k, rows) -> list[float]:
    errors = []
    for b in rows:
        span_q, span_k = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        want = reference(q[span_q], k[span_k], v[span_k])
        errors.append(float((out[span_q].float() - want).norm() / want.norm()))
    return errors


def measure(kernel: Callable, passes: list[list[int]], heads: tuple[int, int]) -> dict:
    """First and warm milliseconds on each pass composition, useful TFLOP/s, the bytes every kernel must move
    (q, k and v read once, the output written) a second, and the error against fp32, also for rows after 40
    keys of a copied prefix (queries aligned to the end of their keys)."""
    firsts, warms, errors, tflops, rates = [], [], [], [], []
    for lengths in passes:
        inputs = _inputs(lengths, 0, heads)
        call = lambda: kernel(*inputs, max(lengths), max(lengths))  # noqa: E731
        first, out = timed(call)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(WARM_CALLS):
            call()
        end.record()
        torch.cuda.synchronize()
        firsts.append(first)
        warms.append(start.elapsed_time(end) / WARM_CALLS)
        tflops.append(sum(4 * heads[0] * D * n * (n + 1) / 2 for n in lengths) / warms[-1] / 1e9)
        rates.append(sum(lengths) * (2 * heads[0] + 2 * heads[1]) * D * 2 / warms[-1] / 1e9)
        errors += _errors(out, *inputs, (0, len(lengths) // 2))
    lengths = passes[0][:6]
    inputs = _inputs(lengths, 40, heads)
    prefix = _errors(kernel(*inputs, max(lengths), max(lengths) + 40), *inputs, range(6))
    return {"first_ms": firsts, "warm_ms": warms, "warm_tflops_median": float(np.median(tflops)),
            "warm_floor_tb_s_median": float(np.median(rates)), "rel_err_max": max(errors),
            "after_prefix_rel_err_max": max(prefix)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--passes", type=int, default=8)
    p.add_argument("--mean", type=float, default=330,
                   help="mean row length (330: F1's, 2500: BIG's, 134: an embedding benchmark's texts)")
    p.add_argument("--heads", default="32,8", help="q heads, kv heads (32,8: Qwen3-4B; 16,8: Qwen3-0.6B)")
    p.add_argument("--kernels", default="flash,triton64,triton128,cudnn,flex,fa4")
    p.add_argument("--sweep", action="store_true", help="add every triton:M:N:W:S[:heavy] setting")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    passes = compositions(args.passes, args.mean)
    heads = tuple(int(h) for h in args.heads.split(","))
    makers = {"flash": lambda: flash, "triton64": lambda: triton_kernel(64), "triton128": lambda: triton_kernel(128),
              "cudnn": lambda: cudnn, "flex": flex_kernel, "fa4": fa4_kernel}
    names = args.kernels.split(",")
    if args.sweep:
        names += [f"triton:{m}:{n}:{w}:{s}{order}" for m in (64, 128) for n in (32, 64, 128) for w in (4, 8)
                  for s in (2, 3, 4) for order in ("", ":heavy")]
    for name in names:
        if name.startswith("triton:"):
            m, n, w, s, *order = name.split(":")[1:]
            makers[name] = lambda m=m, n=n, w=w, s=s, order=order: triton_kernel(
                int(m), int(n), int(w), int(s), heavy_first=order == ["heavy"])
    avoid = os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE") == "1"
    square = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(200):  # the clocks up before the first kernel is timed (~0.3 s of GEMMs)
        square @ square
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "avoid_recompile": avoid,
                    "mean_row": args.mean, "heads": heads, "rows_per_pass": [len(x) for x in passes],
                    "tokens_per_pass": [sum(x) for x in passes]}
    for name in names:  # fa4 last: it replaces the flash kernel for the rest of the process
        try:
            result[name] = measure(makers[name](), passes, heads)
        except Exception:
            result[name] = {"error": traceback.format_exc()[-1500:]}
        print(name, json.dumps(result[name])[:600], flush=True)
    tag = (("-avoid-recompile" if avoid else "") + (f"-mean{args.mean:g}" if args.mean != 330 else "")
           + (f"-heads{heads[0]}-{heads[1]}" if heads != (32, 8) else ""))
    Path(args.out, f"own-attention{tag}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
