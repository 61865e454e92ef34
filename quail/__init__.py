"""Quail: an Arrow Flight SQL server for AI-SQL, with the language model served in-process.

The public names load on first use, so `import quail.planner` (or the server's modules) does not load the
model stack.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "DocumentProvider": "quail.results", "EngineConfig": "quail.session", "Query": "quail.session",
    "Report": "quail.results", "Result": "quail.results", "Session": "quail.session",
    "RemoteSession": "quail.remote", "connect": "quail.remote",
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'quail' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
