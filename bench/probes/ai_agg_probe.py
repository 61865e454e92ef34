"""GPU probe: AI_AGG over 10,000 rows of a ~300-token column, in groups larger than the model's context.

Through the public Python API, dummy weights (the answers are noise: what is
checked is their shape, not their sense). `rows` reviews of ~`tokens` tokens
in `groups` groups, each group more tokens than the model's context, and one
statement: `SELECT grp, AI_AGG(body, ...) FROM reviews GROUP BY grp`. Writes
ai_agg.json to --out: the wall seconds, one answer per group (none NULL), the
model requests (prompts over all levels of every group's reduction tree),
fresh and generated tokens, and, for `--check` groups, whether the answer
equals the same tree computed directly: every prompt laid out by the
documented layout and generated alone, level by level (the CPU tests check
the same in fp32; in bf16 a prompt's tokens may depend on what shares its
passes, so a difference here is reported, not asserted).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyarrow as pa

import quail
from bench.datagen import numbered_reviews
from bench.probes.engine_args import add_engine_arguments, engine_config
from quail.engine.ai.aggregate import packed
from quail.engine.ai.options import DEFAULT_MAX_TOKENS
from quail.engine.runtime.decode import Decoding
from quail.engine.runtime.requests import Request
from quail.engine.runtime.runtime import Runtime

INSTRUCTION = "List the complaints in these reviews."


def directly(runtime: Runtime, texts: list[str]) -> str:
    """The group's reduction tree, every prompt generated alone: as many texts a prompt as fit the context
    beside the answer, level by level, until one answer remains."""
    decoding = Decoding(DEFAULT_MAX_TOKENS, runtime.end_of_turn)
    head, cue = runtime.segments([runtime.layout.preamble() + runtime.layout.task(INSTRUCTION) + "\n\n",
                                  runtime.layout.answer_cue()])
    room = runtime.config.max_position - decoding.max_tokens - len(head) - len(cue)
    level = 0
    while True:
        answers = []
        for chunk in packed(runtime, texts, room, None, level):
            (tokens,) = runtime.generate([Request((head, *chunk, cue), runtime.yes_no)], decoding)
            answers.append(decoding.cut(runtime.tokenizer.decode(tokens)))
        if len(answers) == 1:
            return answers[0]
        texts, level = answers, level + 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--groups", type=int, default=50)
    p.add_argument("--check", type=int, default=2, help="groups whose tree is computed directly too")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    reviews = numbered_reviews(args.rows, args.tokens)
    table = reviews.append_column("grp", pa.array([i % args.groups for i in range(args.rows)]))
    session = quail.Session(engine_config(args))
    runtime = session.runtime
    runtime.warm_up()
    session.register("reviews", table)
    began = time.perf_counter()
    result = session.sql(f"SELECT grp, AI_AGG(body, '{INSTRUCTION}') AS answer FROM reviews GROUP BY grp "
                         "ORDER BY grp").run()
    wall = time.perf_counter() - began
    answers = result.table.column("answer").to_pylist()
    texts = {g: [b for b, k in zip(table.column("body").to_pylist(), table.column("grp").to_pylist()) if k == g]
             for g in range(args.check)}
    group_tokens = sum(len(runtime.tokenizer.encode(t)) for t in texts[0]) if texts else 0
    checked = {}
    for g, group in texts.items():
        runtime.runner.tree.clear()
        checked[g] = directly(runtime, group) == answers[g]
    report = result.report
    out = {"model": args.model, "precision": args.precision, "rows": args.rows, "groups": args.groups,
           "context_tokens": runtime.config.max_position, "first_group_tokens": group_tokens,
           "wall_s": round(wall, 2), "answers": len(answers), "answers_not_null": sum(a is not None for a in answers),
           "distinct_answers": len(set(answers)), "requests": report.requests, "fresh_tokens": report.fresh_tokens,
           "logical_tokens": report.logical_tokens, "generated_tokens": report.generated_tokens,
           "equal_to_direct_tree": checked}
    print(json.dumps(out), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ai_agg.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
