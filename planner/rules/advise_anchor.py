"""Advice on an AI join's anchor: the planner says when the other would ask the model less.

The query decides which document comes first.
"""

from __future__ import annotations

from dataclasses import replace

from quail.planner.ai_calls import AICall
from quail.planner.core import AICore


def advise_anchor(core: AICore) -> AICore:
    """A note for each AI join of two tables whose other document, as anchor, would ask fewer model tokens
    (each anchor once but its tokens resident in the KV pool, then the other document and the question per
    pair). The anchor changes the prompt, so only the query changes it (its `anchor` option); given where
    the planner orders the joins itself.

    >>> from quail.planner.rules.examples import notes
    >>> query = "SELECT r.id, p.id FROM products p, reviews r WHERE AI_FILTER(PROMPT('Is {0} about {1}?', p.name, r.body))"
    >>> notes(query)
    join order p, r: ...
    AI join 'Is {0} about {1}?': anchoring {1} would ask ~223 model tokens instead of ~229; add {'anchor': 1} ...
    >>> notes(query, without="advise_anchor")
    join order p, r: ...
    """
    if not core.orders_joins:
        return core
    notes = [note for c in core.pending if c.call is not None and len(c.refs) == 2
             for note in _other_anchor(core, c.call)]
    return replace(core, notes=core.notes + notes)


def _other_anchor(core: AICore, call: AICall) -> list[str]:
    by_alias = {r.alias: r for r in core.relations}
    sides = [core.refs(arg) for arg in call.args]
    if len(call.args) != 2 or any(len(side) != 1 for side in sides) or sides[0] == sides[1]:
        return []
    rows = [by_alias[next(iter(side))].rows for side in sides]
    tokens, question = core.prompt_tokens(call)

    def asked(anchor: int) -> float:
        fresh = rows[anchor] * tokens[anchor] * (1 - core.resident_share(call, anchor))
        return fresh + rows[0] * rows[1] * (tokens[1 - anchor] + question)

    chosen, other = asked(call.anchor), asked(1 - call.anchor)
    if other >= chosen:
        return []
    return [f"AI join {call.template!r}: anchoring {{{1 - call.anchor}}} would ask ~{other:,.0f} model tokens "
            f"instead of ~{chosen:,.0f}; add {{'anchor': {1 - call.anchor}}} to choose it (the prompt changes)"]
