"""The relay side, what beat runs: claim due rows and hand them to a publisher, as fast as the
broker's queues take them, and recover rows their worker left.

- ``claims``: the relay pass, claim due ``pending`` rows (``dispatched`` + a lease) in batches
  and hand them to a publisher (``delivery.worker.publish``);
- ``backpressure``: how many more tasks the relay may publish to each queue now;
- ``sweeper``: rows whose lease expired go to their ``on_unknown`` policy or back to
  ``pending``; rows past their time-to-live end ``expired``.

May import: ``delivery.core``, ``delivery.config``, ``delivery.transitions`` (every status
write) and ``delivery.observability``; never Celery (``delivery.worker.schedule`` calls in
here), the outbox or sending sides, the CLI or ``delivery.ops``.
"""
