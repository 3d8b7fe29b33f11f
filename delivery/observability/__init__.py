"""Observability: what the pipeline tells the world while it works.

- ``events``: every state change of a message is a frozen ``Transition``, logged as one JSON
  line on the ``delivery.events`` logger (never a recipient or payload) and passed to hooks.
- ``metrics``: Prometheus: the outbox read on each scrape (``delivery metrics``) and counters
  fed by the hooks in each worker (``delivery.worker.metrics``).
- ``tracing``: OpenTelemetry, when the ``[otel]`` extra is installed and a tracer provider is
  set: the trace context stored at ``enqueue``, a span per publish and per attempt, and each
  state change as a span event (``events.emit`` calls it).

``events`` imports nothing of ``delivery`` but ``tracing``, which imports nothing of it, so
every room may emit and trace. ``metrics`` may import
``delivery.ops``, ``delivery.guards.breaker`` and ``delivery.core`` (models, status).
"""
