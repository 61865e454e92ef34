"""Quail: an Arrow Flight SQL server for AI-SQL, with the language model served in-process."""

__version__ = "0.1.0"

from quail.session import DocumentProvider, EngineConfig, Query, Report, Result, Session  # noqa: E402
from quail.remote import RemoteSession, connect  # noqa: E402

__all__ = ["DocumentProvider", "EngineConfig", "Query", "RemoteSession", "Report", "Result", "Session", "connect",
           "__version__"]
