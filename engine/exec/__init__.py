"""Relational execution: plan steps run over Arrow in DuckDB, the catalog and the data directory."""
