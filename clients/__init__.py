"""Client-side helpers and runnable examples that talk to a Quail server over Flight SQL."""
