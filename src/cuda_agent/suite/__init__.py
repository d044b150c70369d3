"""Whole suites in KernelBench layout: judge a folder of solutions (`evaluate`), or run the agent on every task and
judge its best kernels (`optimize`)."""
