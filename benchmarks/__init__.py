"""Benchmarks anyone can re-run; each prints a markdown table for BENCHMARKS.md."""

__all__ = ["common"]
