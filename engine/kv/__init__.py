"""KV on the device: the pool of token slots, runs of them, and the resident tree that indexes them for all queries."""
