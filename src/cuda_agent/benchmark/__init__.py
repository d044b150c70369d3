"""Benchmarks over task suites (KernelBench layout)."""
