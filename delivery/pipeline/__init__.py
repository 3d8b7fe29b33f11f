"""The pipeline: a message from the caller's transaction to its final state.

In the order a message meets them:

- ``keys``, ``validation``: idempotency keys from business intent; checks on ``enqueue``'s
  input, each failure an ``InvalidMessage`` naming the field.
- ``outbox``: ``enqueue`` writes the row in the caller's transaction; the post-commit nudge.
- ``relay``: claims due ``pending`` rows (``dispatched`` + lease) and hands them to a publisher.
- ``sender``: what a worker's task does, for one message or a batch (one path), answering a
  closed ``Action`` per message; ``attempt``: one message's checks, breaker, take and call;
  ``settle``: what an outcome does to the row; ``transitions``: the one room that writes a
  message's status (each transition a named function that emits its event; the relay, the
  sweeper and ``delivery.ops`` call it too); ``leases``: what a live worker renews.
- ``sweeper``: recovers rows whose lease expired and expires rows past their time-to-live.

And what they share: ``models`` (the schema; its migrations are ``delivery/migrations``),
``status`` (the states and every transition), ``outcomes`` (one attempt's closed set of
results), ``policies`` (what an unknown outcome does), ``backoff`` (one pure function),
``bounds`` (what provider text may be stored and printed: lengths, masks, clamps).

May import: ``delivery.errors``, ``delivery.config``, ``delivery.runtime``,
``delivery.providers``, ``delivery.guards`` and ``delivery.observability.events``; never
Celery (``delivery.worker`` calls in here, not the other way round), the CLI or ``delivery.ops``.
"""
