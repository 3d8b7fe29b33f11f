"""A send rate limit per provider, shared by every worker through Redis: a token bucket.

``rate_limit`` (messages per second, ``[providers.NAME]``) refills the bucket; it holds at
most ``max(1, rate_limit)`` tokens, so a burst after a quiet spell is at most one second's
worth. The bucket lives in a Redis hash updated by one Lua script on Redis's own clock
(atomic across processes and machines). ``acquire`` returns 0 when a token was taken, else
the seconds until one will be there; the sender then waits that long without touching the
row or spending an attempt.

While Redis is unreachable each process keeps its own bucket at the full rate (logged once):
the limit then holds per process instead of in total, and no send ever fails because of it;
Redis is tried again every ``REDIS_RETRY`` seconds.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

__all__ = ["RateLimiter"]

log = logging.getLogger("delivery.ratelimit")
REDIS_RETRY = 5.0  # seconds on the local bucket before Redis is tried again

_SCRIPT = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""


class RateLimiter:
    """One provider's token bucket. ``client`` None means this process's own bucket."""

    def __init__(self, provider: str, rate: float, client: redis.Redis | None) -> None:
        self.provider, self.rate, self.burst = provider, rate, max(1.0, rate)
        self.key = f"delivery:rate:{provider}"
        self._client = client
        self._script = client.register_script(_SCRIPT) if client is not None else None
        self._lock = threading.Lock()
        self._tokens, self._at = self.burst, time.monotonic()
        self._redis_down = False
        self._retry_redis_at = 0.0

    def acquire(self) -> float:
        """Take a token: 0.0, or the seconds to wait before asking again."""
        if self._script is not None and time.monotonic() >= self._retry_redis_at:
            try:
                wait = float(self._script(keys=[self.key], args=[self.rate, self.burst]))
            except redis.RedisError as exc:
                if not self._redis_down:
                    log.warning(
                        "rate limit of %s: Redis unreachable (%s); limiting per process",
                        self.provider,
                        exc,
                    )
                self._redis_down = True
                self._retry_redis_at = time.monotonic() + REDIS_RETRY
            else:
                if self._redis_down:
                    log.warning("rate limit of %s: Redis is back", self.provider)
                self._redis_down = False
                return wait
        return self._local()

    def _local(self) -> float:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return 0.0
            return (1 - self._tokens) / self.rate
