"""Numerical check of the runtime's paths against the fp32 torch reference (run on the GPU).

    python -m bench.gpu_check --model dummy:qwen3-0.6b --device cuda --out DIR

For dummy weights of a named shape: the plain path (every prompt in full) in
fp32 is the reference; the shared-prefix path (radix plan, suffixes after
resident KV) in fp32 must match it to float round-off, and both paths in
bf16 within bf16's error (relative error of the final hidden state, absolute
error of P(yes) over the label tokens, and how many yes/no decisions agree).
Writes check-<model>.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import quail
from quail.engine import strategies
from quail.engine.ai_ops import Question, build_requests
from quail.engine.stats import Stats

from .datagen import Workload, generate


def _requests(runtime):
    """Three questions over each of 40 reviews: several suffixes per shared anchor, mixed lengths."""
    bodies = generate(Workload(0.0008, length_scale=0.5), ["reviews"])["reviews"]["body"].to_pylist()
    questions = ["Is {0} positive?", "Does {0} mention the staff?", "Is {0} longer than a paragraph?"]
    return [r for q in questions for r in build_requests(runtime, Question(q), [[b] for b in bodies])]


def _run(runtime, requests, strategy):
    hidden = strategies.STRATEGIES[strategy](runtime.runner, requests, Stats())
    stacked = torch.stack(hidden).float()
    logp = runtime.runner.answer_logprobs(torch.stack(hidden), runtime.yes_no)
    return stacked, np.exp(logp[:, 1])


def check(model: str, device: str, tokenizer: str | None) -> dict:
    config = quail.EngineConfig(model=model, device=device, precision="fp32", tokenizer=tokenizer)
    reference = quail.Session(config).runtime
    requests = _requests(reference)
    ref_hidden, ref_p = _run(reference, requests, "naive")
    out = {"model": model, "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else device,
           "requests": len(requests), "tokens": int(sum(len(r) for r in requests)), "paths": {}}
    for precision, strategy in [("fp32", "quail"), ("bf16", "naive"), ("bf16", "quail")]:
        if precision == "bf16":
            reference.runner.model.to(torch.bfloat16)  # in place: the fp32 paths ran first
        hidden, p = _run(reference, requests, strategy)
        rel = ((hidden - ref_hidden).norm(dim=-1) / ref_hidden.norm(dim=-1)).cpu().numpy()
        out["paths"][f"{precision}-{'shared-prefix' if strategy == 'quail' else 'plain'}"] = {
            "hidden_rel_err_max": float(rel.max()), "hidden_rel_err_mean": float(rel.mean()),
            "p_yes_abs_err_max": float(np.abs(p - ref_p).max()),
            "decisions_agree": float(((p > 0.5) == (ref_p > 0.5)).mean()),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="dummy:qwen3-0.6b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer directory (default: the embedded model's)")
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    result = check(args.model, args.device, args.tokenizer)
    path = Path(args.out) / f"check-{args.model.removeprefix('dummy:')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
