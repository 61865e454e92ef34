"""Benchmarks: workload generator, query files, baselines, the harness and its report."""
