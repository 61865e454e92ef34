"""Execution: relational operators over Arrow, AI operators and the inference runtime."""
