"""The shared vocabulary of every room: what a message is, the states it may be in, what one
attempt can end as, and the pure rules over them. Nothing here runs a process or a query of
its own.

- ``models``: the outbox schema, one row per logical message and one per attempt (its
  migrations are ``delivery/migrations``);
- ``status``: the closed set of states and every transition between them;
- ``outcomes``: one attempt's closed set of results, and ``classify_exception``, the one place
  an exception becomes an outcome;
- ``policies``: what an unknown outcome does (``retry``, ``lookup``, ``give_up``);
- ``backoff``: the delay before the next attempt, one pure function;
- ``bounds``: what provider text may be stored and printed (lengths, masks, clamps);
- ``clock``: the database's clock, the one every lease and due time is compared on.

May import: ``delivery.errors`` only; every other room may import this one.
"""
