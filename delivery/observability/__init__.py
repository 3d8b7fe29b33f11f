"""Observability: what the pipeline tells the world while it works.

- ``events``: every state change of a message is a frozen ``Transition``, logged as one JSON
  line on the ``delivery.events`` logger (never a recipient or payload) and passed to hooks.
- ``metrics``: Prometheus: the outbox read on each scrape (``delivery metrics``) and counters
  fed by the hooks in each worker (``delivery.worker.metrics``).

``events`` imports nothing of ``delivery``, so every room may emit. ``metrics`` may import
``delivery.ops``, ``delivery.guards.breaker`` and ``delivery.core`` (models, status).
"""
