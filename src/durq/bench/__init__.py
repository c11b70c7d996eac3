"""``durq bench``: enqueue, processing and pickup-latency figures on any broker.

Use :func:`run_bench` with :class:`BenchOptions` from code; the command line is
``durq bench [--tasks N] [--concurrency C] [--broker URL] [--json] [--latency-tasks M]``."""

from durq.bench.runner import BenchError, BenchOptions, latency_summary, machine, run_bench

__all__ = ["BenchError", "BenchOptions", "latency_summary", "machine", "run_bench"]
