"""Guards around a send: what may stop or delay a call to a provider before it happens.

- ``breaker``: a circuit breaker per provider, shared by every worker through Redis; its
  states, permits, hooks and ``Breakers`` (one per configured provider).
- ``breaker_machine``: the breaker's state machine, as the Lua script Redis runs and as its
  in-process twin for when Redis is away.
- ``failover``: the failover rule, when a message may move to the next provider of its
  route and to which (a breaker that is open is skipped), and where a redrive sends it.
- ``ratelimit``: a token bucket per provider, shared the same way.
- ``redis_client``: the fail-fast Redis client they use: a send never waits on Redis.
- ``suppression``: the suppression list, recipients a channel must not send to (keyed
  hashes, in the outbox's database).

A guard answers; it never moves a message: the sender decides what the answer does to the
row. May import: ``delivery.config.settings``, ``delivery.observability.events`` (hooks) and
``delivery.core.models`` (the suppression list's table).
"""
