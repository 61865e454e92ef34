"""Tables and questions the AI-SQL tests share: reviews and aspects, and the hash decision of a prompt."""

from __future__ import annotations

import pyarrow as pa

from quail.engine.ai.operators import Question, build_requests, content_hash

REVIEWS = pa.table({
    "id": list(range(8)),
    "body": ["Great pasta and friendly staff.", "Cold soup, rude waiter.", "Far too expensive for the portions.",
             "Lovely garden terrace.", "Booking online was a nightmare.", "Best espresso in town.",
             "Noisy room, thin walls.", None],
    "stars": [5, 1, 2, 4, 1, 5, 2, 3],
})
ASPECTS = pa.table({"id": [0, 1, 2], "aspect": ["the food", "the price", "the service"]})
SELECTIVITY = 0.5
FILTER = "Is {0} a complaint?"
JOIN = "Does {0} discuss {1}?"
OPTS = f"{{'selectivity': {SELECTIVITY}}}"


def decide(runtime, template: str, layout: str, docs: list[str], anchor: int = 0) -> bool:
    """The hash decision of the prompt the layout renders for these documents."""
    (request,) = build_requests(runtime, Question(template, layout, anchor=anchor), [docs])
    return content_hash(request) < SELECTIVITY
