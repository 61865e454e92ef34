"""KV of token runs between forward passes, and the prefix cache that keeps documents' KV between steps and queries."""
