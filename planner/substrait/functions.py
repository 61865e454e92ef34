"""The extension functions of Quail's Substrait plans: Substrait's standard ones and Quail's AI functions."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from substrait.extension_registry import ExtensionRegistry
from substrait.extensions.extensions_pb2 import SimpleExtensionDeclaration, SimpleExtensionURN
from substrait.plan_pb2 import Plan
from substrait.type_pb2 import Type

from quail.engine.ai.kinds import KINDS
from quail.engine.errors import Unimplemented

from quail.planner.substrait.types import describe

AI_YAML = Path(__file__).with_name("quail_ai_functions.yaml")
AI_URN = "extension:dev.quail:ai_functions"
AI_FUNCTIONS = {kind.name: kind.substrait for kind in KINDS.values()}  # plan kind → Substrait name
CLASSIFY_JSON = "ai_classify_json"  # AI_CLASSIFY's value in SQL: {"labels": [label]} as JSON


@cache
def registry() -> ExtensionRegistry:
    """Substrait's standard extension YAMLs and Quail's AI functions (loaded once: it takes a moment)."""
    functions = ExtensionRegistry()
    functions.register_extension_yaml(AI_YAML)
    return functions


def signature_text(signature: list[Type | str]) -> str:
    return ", ".join(a if isinstance(a, str) else describe(a) for a in signature)


class Extensions:
    """The functions one plan calls, each with its plan-local anchor (from 1, in order of first use)."""

    def __init__(self) -> None:
        self._anchors: dict[tuple[str, str], int] = {}

    def resolve(self, name: str, signature: list[Type | str]) -> tuple[int, Type]:
        """The anchor and output type of `name` over arguments of these types (an enumeration: its option)."""
        found = registry().find_function(name, signature)
        if found is None:
            raise Unimplemented(f"Substrait export: no Substrait function {name}({signature_text(signature)})")
        entry, output = found
        anchor = self._anchors.setdefault((entry.urn, repr(entry)), len(self._anchors) + 1)
        return anchor, output

    def declare(self, plan: Plan) -> None:
        """Write the URNs and function declarations into the plan."""
        urns = list(dict.fromkeys(urn for urn, _ in self._anchors))
        plan.extension_urns.extend(SimpleExtensionURN(extension_urn_anchor=i + 1, urn=urn)
                                   for i, urn in enumerate(urns))
        plan.extensions.extend(
            SimpleExtensionDeclaration(extension_function=SimpleExtensionDeclaration.ExtensionFunction(
                extension_urn_reference=urns.index(urn) + 1, function_anchor=anchor, name=name))
            for (urn, name), anchor in self._anchors.items())


@dataclass(frozen=True)
class Declared:
    """A function a plan declares: its extension URN and signature name ("add:i64_i64")."""

    urn: str
    name: str

    @property
    def base(self) -> str:
        return self.name.split(":")[0]


def declared_functions(plan: Plan) -> dict[int, Declared]:
    """The plan's functions by anchor."""
    urns = {u.extension_urn_anchor: u.urn for u in plan.extension_urns}
    return {d.extension_function.function_anchor: Declared(urns.get(d.extension_function.extension_urn_reference, ""),
                                                           d.extension_function.name)
            for d in plan.extensions if d.WhichOneof("mapping_type") == "extension_function"}
