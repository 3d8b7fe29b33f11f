"""Runtime wiring: the objects one process builds from its settings.

- ``current``: this process's settings (``configure``, ``configure_lazily``, ``get_settings``),
  loaded from the environment on first use.
- ``db``: engines, sessions, the schema migrations (``delivery/migrations``) and whether the
  outbox is usable (``check_outbox``, ``database_error``: one line naming
  ``DELIVERY_DATABASE_URL``).
- ``partitions``: a PostgreSQL outbox partitioned by day: its days, created ahead and
  dropped whole by ``prune``; ``conversion``: an outbox converted to that shape while the
  pipeline runs (``delivery db partition``; a new outbox at ``delivery db upgrade``).
- ``service``: ``Service``, what one worker or relay holds: the engine, one pooled client per
  provider, the circuit breakers and the rate limits.
- ``hooks``: the app's outcome hooks named in the settings (``[delivery] outcome_hooks``),
  imported and registered in the processes the app does not start itself.

May import: ``delivery.config``, ``delivery.providers``, ``delivery.guards`` and
``delivery.observability.events`` (to register the outcome hooks); never the pipeline (the
pipeline is handed a ``Service``) and never Celery.
"""
