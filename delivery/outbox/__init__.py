"""The outbox side: a message from the caller's call to its committed row.

- ``enqueue``: ``enqueue`` writes the row in the caller's own transaction, and the post-commit
  nudge (a due row written claimed, published after the commit);
- ``bulk``: ``enqueue_many``, a campaign in the caller's transaction, one statement per chunk;
- ``insert``: the INSERTs of validated rows (one row, or a chunk);
- ``validation``: checks on ``enqueue``'s input, each failure an ``InvalidMessage`` naming the
  field (recipients, payloads, keys);
- ``keys``: idempotency keys derived from business intent;
- ``routing``: a message's channel, provider, unknown-outcome policy and limits.

May import: ``delivery.core``, ``delivery.errors``, ``delivery.config``, ``delivery.runtime``,
``delivery.transitions`` (a failed nudge gives its rows back) and ``delivery.relay`` (the
claims a publisher takes); never Celery, the sending side, the CLI or ``delivery.ops``.
"""
