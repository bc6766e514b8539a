"""Benchmarks of the product: ``python -m bench.<name>`` from the repository root; each prints one table."""
