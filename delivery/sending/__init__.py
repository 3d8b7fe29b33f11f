"""The worker side: what a worker's task does with the messages it carries.

- ``sender``: one attempt at each message of a task, on one path whether it carries one
  message or a batch, each answered with a closed ``Action``;
- ``attempt``: one message's checks, its breaker, the take and the provider call;
- ``settle``: what one attempt's outcome does to its message, in one transaction with the
  attempt's row;
- ``leases``: what a live worker renews on the messages it holds.

May import: ``delivery.core``, ``delivery.errors``, ``delivery.config``, ``delivery.runtime``,
``delivery.transitions``, ``delivery.providers``, ``delivery.guards`` and
``delivery.observability``; never Celery (``delivery.worker`` calls in here), the outbox or
relay sides, the CLI or ``delivery.ops``.
"""
