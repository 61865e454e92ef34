"""Every docstring example in the package runs and says what it does (doctest, ellipses and whitespace as
written): a module's examples are checked where they stand, not picked by hand test by test."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import quail

NEEDS = {"triton": "quail.engine.kernels."}  # modules under this prefix ending in _triton need Triton (a GPU)


def _modules() -> list[str]:
    found = {info.name for info in pkgutil.walk_packages(quail.__path__, "quail.")}
    for package in ("quail.engine", "quail.planner", "quail.server"):
        found |= {info.name for info in pkgutil.walk_packages(importlib.import_module(package).__path__,
                                                              package + ".")}
    return sorted(name for name in found if not name.endswith("_triton") or importlib.util.find_spec("triton"))


MODULES = [name for name in _modules()
           if any(test.examples for test in doctest.DocTestFinder().find(importlib.import_module(name)))]


def test_the_examples_are_found():
    assert {"quail.planner.rules.rank_ai_filters", "quail.engine.exec.sql_guard",
            "quail.engine.runtime.scheduler"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_examples(name):
    failed, tried = doctest.testmod(importlib.import_module(name),
                                    optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert tried and not failed


def test_every_module_opens_with_a_one_line_summary():
    """A module's docstring is a summary line, then (after a blank line) whatever a newcomer needs next."""
    unsummarized = []
    for name in _modules():
        doc = (importlib.import_module(name).__doc__ or "").strip("\n").split("\n")
        if not doc[0] or (len(doc) > 1 and doc[1].strip()):
            unsummarized.append(name)
    assert not unsummarized, unsummarized


def test_every_public_class_opens_with_a_one_line_summary():
    unsummarized = []
    for name in _modules():
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == name and not attribute.startswith("_"):
                doc = (value.__doc__ or "").strip("\n").split("\n")
                if not doc[0].strip() or (len(doc) > 1 and doc[1].strip()):
                    unsummarized.append(f"{name}.{attribute}")
    assert not unsummarized, unsummarized
