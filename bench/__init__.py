"""Benchmarks of ``delivery`` next to Celery alone (``python -m bench.NAME``; see README.md)."""
