"""Where a semantic top-k's time goes: each part's wall time, summed by a timer wrapped around it.

    python -m bench.probes.embedding_parts --embed-model dummy:qwen3-embedding-0.6b --device cuda \\
        --precision bf16 --tokenizer DIR --out DIR

- The query and its rows are bench/embedding_queries.py's top-k (`--rows` texts, 10 best), run cold (every
  text embedded) and again (every embedding kept).
- The parts, by the function each timer wraps: the statement's embedding call (`Embeddings.embed`), its
  tokenizing and its model call (`tokens`, `embed_ids`); inside the model call the passes (`hidden`: a
  decoder's, up to the device's last result, the device waited for inside the timer) and the rest
  (requests built, results stacked, normalized, copied back); the runtime owner's passes and the job's
  steps (`_pass`, `fill`, `rows`, `take`); the cosines (`ai_cosine`) and the Arrow array of embeddings.
- 'main' parts run on the statement's thread, 'owner' parts on the runtime's; the two overlap.
- Writes `<date>-<cpu|gpu>-embedding-topk-parts-<model>-<sha>.txt` to `--out`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import torch

import quail
from quail.engine.exec import embedding_functions
from quail.engine.model.config import EngineConfig
from quail.engine.runtime import baselines, decoder_embedding, embeddings, runtime, scheduler
from quail.engine.model import static_embedding

from bench.embedding_queries import QUERY, timed
from bench.embedding_speed import texts
from bench.provenance import git_commit

Totals = dict[str, list[float]]


def wrapped(totals: Totals, label: str, fn: Callable[..., Any], after: Callable[[], None] | None = None) -> Callable:
    """`fn` with its wall time and calls added to `totals[label]`; `after` runs inside the timer."""
    @functools.wraps(fn)
    def timer(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
            if after is not None:
                after()
            return out
        finally:
            spent = totals[label]
            spent[0] += time.perf_counter() - started
            spent[1] += 1
    return timer


def wrap_parts(totals: Totals, device: str) -> None:
    """Timers around the parts (see the module), before the session registers its functions."""
    wait = torch.cuda.synchronize if device.startswith("cuda") else None
    parts = [(embeddings.Embeddings, "embed", "Embeddings.embed (main)", None),
             (decoder_embedding.DecoderEmbedding, "tokens", "tokens (main)", None),
             (decoder_embedding.DecoderEmbedding, "embed_ids", "embed_ids (main)", None),
             (static_embedding.StaticEmbedding, "tokens", "tokens (main)", None),
             (static_embedding.StaticEmbedding, "embed_ids", "embed_ids (main)", None),
             (runtime.Runtime, "hidden", "hidden: passes queued and done (main)", wait),
             (scheduler.PassScheduler, "_pass", "scheduler._pass (owner)", None),
             (baselines._Independent, "fill", "job.fill (owner)", None),
             (baselines._Independent, "rows", "job.rows (owner)", None),
             (baselines._Independent, "take", "job.take (owner)", None),
             (embedding_functions, "cosine", "ai_cosine (main)", None),
             (embedding_functions, "embedding_array", "embedding_array (main)", None)]
    for owner, name, label, after in parts:
        setattr(owner, name, wrapped(totals, label, getattr(owner, name), after))


def report(title: str, seconds: float, totals: Totals) -> list[str]:
    """The run's wall time, then each part's seconds and calls, largest first."""
    lines = [f"{title}: {seconds:.3f} s"]
    for label, (spent, calls) in sorted(totals.items(), key=lambda item: -item[1][0]):
        lines.append(f"  {spent:8.3f} s  {int(calls):6d}  {label}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.embedding_parts", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--embed-model", default=None, help="default: the embedded static model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    totals: Totals = defaultdict(lambda: [0.0, 0])
    wrap_parts(totals, args.device)
    config = EngineConfig(model=args.embed_model, embed_model=args.embed_model, device=args.device,
                          precision=args.precision, tokenizer=args.tokenizer) if args.embed_model else EngineConfig()
    session = quail.Session(config)
    session.register("docs", pa.table({"id": range(args.rows), "body": texts(args.rows, 12, seed=0, numbered=False)}))
    session.sql("SELECT AI_EMBED('load the model') AS e").run()
    totals.clear()
    model = session.runtime.embeddings.name
    lines = [f"# bench.probes.embedding_parts: the top-k of {args.rows} rows ({model}, {args.device} "
             f"{args.precision}) at {git_commit()[:7]}, each part's wall time summed by a timer around it",
             "# (seconds, calls, part; 'main': the statement's thread, 'owner': the runtime's)"]
    for run in ("cold", "warm"):
        seconds, _ = timed(session, QUERY)
        lines += report(f"{run} top-k of {args.rows}", seconds, totals)
        totals.clear()
    print("\n".join(lines))
    device = "cpu" if args.device == "cpu" else "gpu"
    path = Path(args.out) / (f"{dt.date.today().isoformat()}-{device}-embedding-topk-parts-"
                             f"{model.split(':')[-1].replace('/', '-')}-{git_commit()[:7]}.txt")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
