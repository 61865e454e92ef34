"""The inference runtime: requests, prompt layout, the scheduler of forward passes, and the model runner."""
