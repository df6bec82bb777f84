"""Benchmarks that hold the event log to the throughput the design promises (docs/benchmarks.md)."""
