"""Substrait: a physical plan exported as a Substrait plan (producer), and one imported as a plan (consumer)."""
