"""Quail: an Arrow Flight SQL server for AI-SQL, with the language model served in-process."""

__version__ = "0.1.0"
