"""Benchmarks that print figures; run them as modules from the repository root."""
