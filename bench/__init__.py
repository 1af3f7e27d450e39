"""Benchmarks: each prints its numbers next to a baseline measured or computed in the same run."""
