"""Tables and questions the AI-SQL tests share: reviews and aspects, and the hash decision of a prompt; subjects
and a task for generation."""

from __future__ import annotations

import pyarrow as pa

from quail.engine.ai.asking import Question, build_requests, content_hash

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
SUBJECTS = ["the sea", "a red bicycle", "winter mornings", "why bread rises", "the moon", "a library at night",
            "how bees talk", "an old map", "rain on a tin roof", "the first computer", "a lighthouse keeper",
            "why the sky is blue", "a cup of tea", "volcanoes", "the smell of pine", "a chess opening",
            "paper airplanes", "a quiet train station", "how rivers form", "a jazz trio", "snow leopards",
            "the printing press", "a garden in May", "why cats purr", "a thunderstorm", "the Roman roads",
            "a violin maker", "how glass is made", "desert nights", "a market in the morning", "owls",
            "the history of the spoon, in the style of a museum guide who loves long words"]
TELL = "Tell me about {0} in one sentence."  # a task over each subject, answered in free text
TELL_TOKENS = 10  # tokens generated per subject where generation is compared with HF transformers


def decide(runtime, template: str, layout: str, docs: list[str], anchor: int = 0) -> bool:
    """The hash decision of the prompt the layout renders for these documents."""
    (request,) = build_requests(runtime, Question(template, layout, anchor=anchor), [docs])
    return content_hash(request) < SELECTIVITY
