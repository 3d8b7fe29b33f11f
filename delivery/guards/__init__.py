"""Guards around a send: what may stop or delay a call to a provider before it happens.

- ``breaker``: a circuit breaker per provider, shared by every worker through Redis (one Lua
  script; ``breaker_script`` holds it and its in-process twin for when Redis is away).
- ``ratelimit``: a token bucket per provider, shared the same way.
- ``redis``: the fail-fast Redis client both use: a send never waits on Redis.

A guard answers; it never touches the outbox: the sender decides what the answer does to the
row. May import: ``delivery.config.settings`` only (and Redis).
"""
