"""GPU probe: greedy decoding throughput (Runtime.generate) at several batch sizes, against the memory floor.

Dummy weights of a named shape, random prompts of `--prompt` tokens, `--tokens`
generated each (no stop token). For each batch size: wall seconds of the whole
call (prefill included) and of the decode steps alone (the call less a prefill
of the same prompts, timed apart), generated tokens per second, and the floor
of a decode step: the weights and every sequence's KV read once from HBM at the
device's bandwidth (`--bandwidth`, bytes/s), its tokens per second and our
fraction of it. With `--hf`, then HF transformers' `generate` (greedy, the same
number of tokens, no stop) on a model of the same shape and precision (HF's own
random weights: the speed depends on the shapes, not the values), timed the
same way (a one-token generate as its prefill). Writes decode.json to --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import numpy as np
import torch

import quail
from bench.probes.engine_args import add_engine_arguments, engine_config
from quail.engine.kv.pool import token_bytes
from quail.engine.runtime.decode import Decoding
from quail.engine.runtime.loading import DTYPES, DUMMY_SHAPES
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, Segment


def timed(call) -> float:
    """Seconds of the call, the device's queued work included."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    began = time.perf_counter()
    call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--batches", default="64,256,1024")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--bandwidth", type=float, default=4.8e12, help="HBM bytes/s (H200 datasheet)")
    p.add_argument("--hf", action="store_true", help="time HF transformers' generate too")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    hf = hf_generate(args) if args.hf else None  # first: our runtime's pool keeps the memory it takes
    gc.collect()
    torch.cuda.empty_cache()  # HF's model and cache, gone with the call
    runtime = quail.Session(engine_config(args)).runtime
    runtime.warm_up()
    model = runtime.runner.model
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    per_token = token_bytes(model.config.num_layers, model.config.num_kv_heads, model.config.head_dim,
                            model.embed_tokens.weight.dtype)
    rng = np.random.default_rng(0)
    result = {"model": args.model, "precision": args.precision, "prompt_tokens": args.prompt,
              "generated_tokens": args.tokens, "weight_bytes": weight_bytes, "kv_bytes_per_token": per_token,
              "bandwidth": args.bandwidth, "batches": {}}
    runtime.generate([Request((Segment.of(rng.integers(100, 20000, args.prompt), runtime.model_id),),
                              runtime.yes_no)], Decoding(4))  # first calls of the decode path
    for batch in map(int, args.batches.split(",")):
        requests = [Request((Segment.of(rng.integers(100, 20000, args.prompt), runtime.model_id),), runtime.yes_no)
                    for _ in range(batch)]
        runtime.runner.tree.clear()
        prefill = timed(lambda: runtime.score(requests, QueryWork()))
        runtime.runner.tree.clear()
        out: list = []
        work = QueryWork()
        whole = timed(lambda: out.extend(runtime.generate(requests, Decoding(args.tokens), work=work)))
        assert all(len(tokens) == args.tokens for tokens in out)
        steps = args.tokens - 1  # the first token comes from the prefill
        decode_s = max(whole - prefill, 1e-9)
        mean_context = args.prompt + args.tokens / 2
        floor_step = (weight_bytes + batch * mean_context * per_token) / args.bandwidth
        floor = batch / floor_step
        rate = batch * steps / decode_s
        result["batches"][batch] = {"wall_s": round(whole, 3), "prefill_s": round(prefill, 3),
                                    "decode_s": round(decode_s, 3), "step_ms": round(1000 * decode_s / steps, 2),
                                    "tokens_per_s": round(rate), "floor_step_ms": round(1000 * floor_step, 3),
                                    "floor_tokens_per_s": round(floor), "of_floor": round(rate / floor, 4),
                                    "forward_passes": work.stats.forward_passes}
        print(batch, result["batches"][batch], flush=True)
    if hf is not None:
        for batch, timing in hf["batches"].items():
            timing["of_floor"] = round(timing["tokens_per_s"] / result["batches"][batch]["floor_tokens_per_s"], 4)
        result["hf"] = hf
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode.json").write_text(json.dumps(result, indent=1))


def hf_generate(args: argparse.Namespace) -> dict:
    """HF transformers' greedy generate at each batch size, on a Qwen3/Llama model of the dummy shape: seconds
    and decode tokens per second."""
    import transformers

    config, dtype = DUMMY_SHAPES[args.model.removeprefix("dummy:")], DTYPES[args.precision]
    kind = transformers.Qwen3Config if config.qk_norm else transformers.LlamaConfig
    hf_config = kind(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                     intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
                     num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
                     head_dim=config.head_dim, rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps,
                     tie_word_embeddings=config.tie_embeddings, max_position_embeddings=config.max_position)
    with torch.device(args.device):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config, torch_dtype=dtype).eval()
    out = {"transformers": transformers.__version__, "batches": {}}
    for batch in map(int, args.batches.split(",")):
        ids = torch.randint(100, 20000, (batch, args.prompt), device=args.device)

        def generate(tokens: int) -> None:
            with torch.inference_mode():
                hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                            do_sample=False, pad_token_id=0)

        generate(2)  # first calls
        prefill, whole = timed(lambda: generate(1)), timed(lambda: generate(args.tokens))
        decode_s = max(whole - prefill, 1e-9)
        rate = batch * (args.tokens - 1) / decode_s
        out["batches"][batch] = {"wall_s": round(whole, 3), "prefill_s": round(prefill, 3),
                                 "decode_s": round(decode_s, 3), "tokens_per_s": round(rate)}
        print("hf", batch, out["batches"][batch], flush=True)
    return out


if __name__ == "__main__":
    main()
