"""The in-process Python API, written as scripts for the seed system are: only its documented calls.

    python -m quail.clients.api_example [MODEL]

MODEL defaults to the embedded SmolLM2; on a GPU give an HF directory or repo
id (with `device="cuda"` below), as a seed-system script gives its model.
"""

from __future__ import annotations

import sys

import pyarrow as pa

import quail

REVIEWS = pa.table({
    "id": [1, 2, 3, 4],
    "body": ["Cold pasta and a rude waiter.", "Lovely staff, the best tiramisu in town.",
             "The room was spotless and quiet.", "Delivery was two hours late."],
})
ASPECTS = pa.table({"aid": [1, 2], "aspect": ["the food", "the service"]})


def main(model: str | None = None) -> None:
    config = quail.EngineConfig(gpus=1, model=model, backend="quail", device="cpu")
    with quail.Session(config) as session:
        session.register("reviews", quail.DocumentProvider.from_table(REVIEWS, id_col="id"))
        session.register("aspects", quail.DocumentProvider.from_table(ASPECTS, id_col="aid"))
        query = session.sql("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
                            "ON AI_FILTER(PROMPT('Does {0} complain about {1}?', r.body, a.aspect))")
        print(query.explain())
        result = query.run()
        print(result.collect())
        report = result.report
        print(f"{report.wall_s:.2f}s, {report.fresh_tokens} fresh and {report.cached_tokens} cached tokens, "
              f"KV regret {report.kv_regret_tokens}, stages {[s['operator'] for s in report.stages]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
