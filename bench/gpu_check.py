"""Numerical check of the runtime's paths and kernels against the fp32 torch reference (run on the GPU).

    python -m bench.gpu_check --model dummy:qwen3-4b --device cuda --tokenizer DIR --out DIR

Reference: the plain path (every prompt in full), fp32, eager, the attention in
plain torch. Against it, for dummy weights of a named shape: fp32 through the
shared-prefix and block-prefix paths (must match to float round-off); bf16 eager
and compiled, and fp8 compiled, through all three paths (compiled bf16 and fp8
also with own-token attention by flash varlen). Per path: relative
error of the final hidden state, absolute error of the yes/no log-probabilities
and of P(yes), and how many decisions agree. The kernels on their own: cuDNN
attention with its log-sum-exp and the LSE merge against the fp32 reference,
each bf16 layer part (compiled, or by our kernels) against the same part in fp32, and the fp8 path's Triton
quantization kernels against their torch references. Writes check-<model>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import numpy as np
import torch

import quail
from quail.engine.ai.asking import Question, build_requests
from quail.engine.kernels.attention import attend, attention
from quail.engine.kernels.pass_rows import Rows
from quail.engine.kv.runs import KV
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.loading import load_runtime
from quail.engine.runtime.runtime import STRATEGIES

from .datagen import Workload, generate

VARIANTS = [("fp32", False, "buckets"), ("bf16", False, "buckets"), ("bf16", True, "buckets"),
            ("bf16", True, "varlen"), ("fp8", True, "buckets"), ("fp8", True, "varlen")]
PATHS = {"naive": "plain", "quail": "shared-prefix", "prefix": "block-prefix"}


def _requests(runtime):
    """Three questions over each of 40 reviews: several suffixes per shared anchor, mixed lengths."""
    bodies = generate(Workload(0.0008, length_scale=0.5), ["reviews"])["reviews"]["body"].to_pylist()
    questions = ["Is {0} positive?", "Does {0} mention the staff?", "Is {0} longer than a paragraph?"]
    return [r for q in questions for r in build_requests(runtime, Question(q), [[b] for b in bodies])]


def _run(runtime, requests, strategy):
    hidden = torch.stack(STRATEGIES[strategy](runtime.scheduler, runtime.runner, requests, Stats()))
    return hidden.float(), runtime.runner.answer_logprobs(hidden, runtime.yes_no).cpu().numpy()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def kernels(device: str) -> dict:
    """cuDNN attention + LSE and the merged shared-prefix attention against the fp32 reference."""
    torch.manual_seed(1)
    h, hkv, d = 32, 8, 128
    out = {}
    for causal, n, m in [(True, 300, 300), (False, 700, 2500), (True, 15, 15), (False, 12, 40)]:
        q = torch.randn(2, h, n, d, device=device, dtype=torch.bfloat16)
        k = torch.randn(2, hkv, m, d, device=device, dtype=torch.bfloat16)
        v = torch.randn(2, hkv, m, d, device=device, dtype=torch.bfloat16)
        o, lse = attend(q, k, v, causal)
        ro, rlse = attend(q.float(), k.float(), v.float(), causal)
        out[f"attend-{'causal' if causal else 'past'}-{n}x{m}"] = {"out_rel_err": _rel(o, ro), "lse_rel_err": _rel(lse, rlse)}
    lengths = [37, 300, 5, 120, 64]
    runs = [KV.of([torch.randn(c, hkv, d, device=device, dtype=torch.bfloat16)],
               [torch.randn(c, hkv, d, device=device, dtype=torch.bfloat16)]) for c in (2500, 40, 700)]
    pasts = [runs[0], runs[0], None, runs[1], runs[2]]
    t = sum(lengths)
    q = torch.randn(t, h, d, device=device, dtype=torch.bfloat16)
    k = torch.randn(t, hkv, d, device=device, dtype=torch.bfloat16)
    v = torch.randn(t, hkv, d, device=device, dtype=torch.bfloat16)
    as_fp32 = {id(r): KV.of(*([t.float()] for t in r.layer(0))) for r in runs}
    cases = [("one-run", [runs[0], runs[0], None, None, None], None), ("several-runs", pasts, None),
             ("in-pass", [None, None, None, runs[1], runs[1]], [None, 0, 0, None, 3])]  # rows after earlier rows
    for name, chosen, parents in cases:
        want = attention(q.float(), k.float(), v.float(),
                         Rows.build(lengths, [None if p is None else as_fp32[id(p)] for p in chosen], torch.device(device),
                                    parents=parents), 0)
        for layout, padded in [("", True), ("-varlen", False)]:
            got = attention(q, k, v, Rows.build(lengths, chosen, torch.device(device), padded, parents), 0)
            out[f"shared-prefix-attention-{name}{layout}"] = {"out_rel_err": _rel(got, want)}
    return out


def fp8_kernel_errors(device: str) -> dict:
    """The Triton quantizations against their torch references: each one's error against fp32 (the
    dequantized rows), and how far apart their per-token scales are."""
    from quail.engine.kernels import fp8
    from quail.engine.kernels import fp8_triton as fp8_kernels

    torch.manual_seed(3)
    gate, up = (torch.randn(3000, 9728, device=device, dtype=torch.bfloat16) for _ in range(2))
    attn = torch.randn(3000, 4096, device=device, dtype=torch.bfloat16)
    cases = {"silu_mul": ((gate, up), fp8.silu_mul_rows, fp8_kernels.silu_mul_rows,
                          torch.nn.functional.silu(gate.float()) * up.float()),
             "quantize": ((attn,), fp8.quantize_rows, fp8_kernels.quantize_rows, attn.float())}
    out = {}
    for name, (inputs, reference, kernel, want) in cases.items():
        (rv, rs), (kv, ks) = reference(*inputs), kernel(*inputs)
        out[name] = {"torch_rel_err": _rel(rv.float() * rs, want), "triton_rel_err": _rel(kv.float() * ks, want),
                     "scale_rel_diff_max": float(((ks - rs).abs() / rs).max())}
    return out


def layer_parts(runtime) -> dict:
    """Each bf16 layer part as the model runs it (compiled, or by our kernels: DecoderLayer.by_kernels) against
    the same part of the layer in fp32, on the same inputs."""
    import copy

    from quail.engine.model.decoder import DecoderLayer, rope_tables

    model = runtime.runner.model
    layer = model.layers[0]
    reference = copy.deepcopy(layer).float()
    torch.manual_seed(2)
    t = 1234
    x = torch.randn(t, model.config.hidden_size, device=model.embed_tokens.weight.device, dtype=torch.bfloat16)
    cos, sin = rope_tables(torch.arange(t, device=x.device), model.config.head_dim, model.config.rope_theta)
    with torch.inference_mode():
        exact = DecoderLayer.qkv(reference, x.float(), cos, sin)
        fused = model._qkv(layer, x, cos.to(x.dtype), sin.to(x.dtype))
        attn = torch.randn_like(fused[0])
        out = {f"qkv-{name}": _rel(f, e) for name, f, e in zip("qkv", fused, exact)}
        exact = DecoderLayer.finish(reference, x.float(), attn.float())
        out["finish"] = _rel(model._finish(layer, x.clone(), attn), exact)
    return out | {"by_kernels": layer.by_kernels(x)}


def check(model: str, device: str, tokenizer: str | None) -> dict:
    result: dict = {"model": model, "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else device,
                    "kernels": kernels(device) if device.startswith("cuda") else {}, "paths": {}}
    if device.startswith("cuda"):
        result["fp8_kernels"] = fp8_kernel_errors(device)
    reference = None
    for precision, compiled, attention_kind in VARIANTS:
        if attention_kind == "varlen" and not device.startswith("cuda"):
            continue
        config = quail.EngineConfig(model=model, device=device, precision=precision, tokenizer=tokenizer,
                                    compile=compiled, attention=attention_kind)
        runtime = load_runtime(config)
        if reference is None:
            requests = _requests(runtime)
            result.update(requests=len(requests), tokens=int(sum(len(r) for r in requests)))
            reference = _run(runtime, requests, "naive")
        if compiled and precision == "bf16":
            result["layer_parts"] = layer_parts(runtime)
        ref_hidden, ref_logp = reference
        for strategy, path in PATHS.items():
            hidden, logp = _run(runtime, requests, strategy)
            rel = ((hidden - ref_hidden).norm(dim=-1) / ref_hidden.norm(dim=-1)).cpu().numpy()
            p, ref_p = np.exp(logp[:, 1]), np.exp(ref_logp[:, 1])
            variant = f"{precision}{'-compiled' if compiled else ''}{'-varlen' if attention_kind == 'varlen' else ''}"
            result["paths"][f"{variant}-{path}"] = {
                "hidden_rel_err_max": float(rel.max()), "hidden_rel_err_mean": float(rel.mean()),
                "logprob_abs_err_max": float(np.abs(logp - ref_logp).max()),
                "p_yes_abs_err_max": float(np.abs(p - ref_p).max()),
                "decisions_agree": float(((p > 0.5) == (ref_p > 0.5)).mean()),
            }
        del runtime
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return result


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
