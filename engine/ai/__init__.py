"""AI operators: the AI function kinds, rows turned into model requests, answers turned into values."""
