"""The canonical prompt layout: the model's chat template around preamble, documents, question, cue.

- filter (a question over one row): [preamble][document 1]...[document n][question][answer cue]
- join (a question relating rows of several tables): [preamble][document 1][question][document 2]...[answer cue]

The rendered prompt depends on the query text and the row values only, never on
the plan. Documents come first so that one document's KV serves every question
asked of it, and its role as a join anchor ({0} anchors a join). Placeholders
`{i}` of the user's template become the label of the i-th document ("Text 1",
"Text 2", ...). Yes/no questions are answered by the tokens Yes/No; classify
questions list the categories as letters A), B), ... and are answered by a letter,
or (answered by name) list the names and are answered by one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLACEHOLDER = re.compile(r"\{(\d+)\}")
_SENTINEL = "\x00QUAIL_USER_CONTENT\x00"
INSTRUCTION = "Read the texts below, then answer the question about them.\n\n"
TRUE_SPELLINGS = ("Yes", " Yes", "yes", " yes")
FALSE_SPELLINGS = ("No", " No", "no", " no")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LAYOUTS = ("filter", "join")


@dataclass(frozen=True)
class ChatFrame:
    """The model's chat template, split around the user's message.

    The model's chat template split around the user's message; `turn_end`: what closes the assistant's
    turn (its first non-blank text after the assistant's message; "" without a template)."""

    head: str
    tail: str
    turn_end: str = ""

    @classmethod
    def from_template(cls, template: str | None) -> "ChatFrame":
        """Render the template (Jinja, as HF does) around a sentinel user message."""
        if not template:
            return cls("", "\nAnswer:")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        compiled = env.from_string(template)
        text = compiled.render(messages=[{"role": "user", "content": _SENTINEL}], add_generation_prompt=True,
                               bos_token="", eos_token="")
        head, tail = text.split(_SENTINEL)
        answered = compiled.render(messages=[{"role": "user", "content": "?"},
                                             {"role": "assistant", "content": _SENTINEL}],
                                   add_generation_prompt=False, bos_token="", eos_token="")
        after = answered.split(_SENTINEL)[-1].split()
        return cls(head, tail, after[0] if after else "")


def label(index: int) -> str:
    """The name the question uses for the document of placeholder {index}."""
    return f"Text {index + 1}"


def placeholders(template: str) -> list[int]:
    """The placeholder indices a template uses, in order of appearance."""
    return [int(m.group(1)) for m in PLACEHOLDER.finditer(template)]


@dataclass(frozen=True)
class PromptLayout:
    """Texts of the segments of a question over one or more documents."""

    frame: ChatFrame

    def preamble(self) -> str:
        return self.frame.head + INSTRUCTION

    def document(self, index: int, text: str) -> str:
        return f"{label(index)}:\n{text}\n\n"

    def question(self, template: str, labels: tuple[str, ...] = (), by_name: bool = False) -> str:
        """The question; yes/no unless labels are given (then the categories, lettered or by name)."""
        asked = "Question: " + _labelled(template)
        if not labels:
            return asked + "\nAnswer Yes or No."
        if by_name:
            options = "".join(f"\n- {name}" for name in labels)
            return f"{asked}\nCategories:{options}\nAnswer with the name of the best category."
        options = "".join(f"\n{LETTERS[i]}) {name}" for i, name in enumerate(labels))
        return f"{asked}\nCategories:{options}\nAnswer with the letter of the best category."

    def task(self, template: str, schema: str | None = None) -> str:
        """What generation is asked to do, answered in free text or, with a JSON schema, in JSON following it."""
        follows = f"\nAnswer with JSON that follows this schema: {schema}" if schema else ""
        return "Task: " + _labelled(template) + follows

    def answer_cue(self) -> str:
        return self.frame.tail


def _labelled(template: str) -> str:
    """The template with each placeholder {i} naming its document's label."""
    return PLACEHOLDER.sub(lambda m: label(int(m.group(1))), template)
