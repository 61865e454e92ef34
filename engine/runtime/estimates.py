"""How many rows the executor sends the model at a time, and the text-to-token estimate plans use.

- PROBE_ROWS: an AI filter chain's probe, before its filters are ranked by observed selectivity;
- CHUNK_ROWS: a streamed plan's first and largest chunks;
- CHARS_PER_TOKEN: characters a token, for estimates only.
"""

PROBE_ROWS = 64
CHARS_PER_TOKEN = 4.0  # for estimates only: English text in a BPE vocabulary
CHUNK_ROWS = (64, 8192)  # a chunked plan's first and largest chunks: the first rows leave after a pass or two
