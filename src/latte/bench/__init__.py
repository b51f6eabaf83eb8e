"""Serving benchmarks, soak and overload runs against a real tritonserver.

`latte bench` drives perf_analyzer over a concurrency and a Poisson request-rate sweep,
samples Triton's and Latte's Prometheus metrics and process memory while it runs, and
writes results.json plus a self-contained report.html.
"""
