"""Execution, in layers (each imports only those before it): kv, kernels, model, runtime, ai, exec."""
