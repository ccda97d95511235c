"""Benchmarks behind `rljax bench` (see rljax/commands/bench.py)."""
