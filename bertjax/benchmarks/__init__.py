"""Benchmarks runnable with `python -m bertjax.benchmarks.<name>`."""
