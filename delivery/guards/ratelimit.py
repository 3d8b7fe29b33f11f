"""A send rate limit per provider, shared by every worker through Redis: a token bucket
(docs/concepts.md, "Rate limit"), updated by one Lua script on Redis's own clock.

The bucket holds at most ``max(1, rate_limit)`` tokens: a burst after a quiet spell is at most
one second's worth. ``acquire`` returns 0 when a token was taken, else the seconds until one
will be there. While Redis is unreachable each process keeps its own bucket at the full rate
(logged once), starting empty so that the switch never adds a burst; Redis is tried again
every ``REDIS_RETRY`` seconds. A Redis that answers slowly (a timeout) is not down: the caller
waits ``1 / rate`` s and asks again, so a loaded machine never sends over the shared rate;
only ``TIMEOUTS_BEFORE_LOCAL`` timeouts in a row count as down.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

__all__ = ["RateLimiter"]

log = logging.getLogger("delivery.ratelimit")
REDIS_RETRY = 5.0  # seconds on the local bucket before Redis is tried again
TIMEOUTS_BEFORE_LOCAL = 3  # timeouts in a row that count as Redis being down

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
        self._timeouts = 0

    def acquire(self) -> float:
        """Take a token: 0.0, or the seconds to wait before asking again."""
        if self._script is not None and time.monotonic() >= self._retry_redis_at:
            try:
                wait = float(self._script(keys=[self.key], args=[self.rate, self.burst]))
            except redis.TimeoutError as exc:
                self._timeouts += 1
                if self._timeouts < TIMEOUTS_BEFORE_LOCAL:
                    return 1.0 / self.rate  # the token may have been taken: never guess
                self._fall_back(exc)
            except redis.RedisError as exc:
                self._fall_back(exc)
            else:
                self._timeouts = 0
                if self._redis_down:
                    log.warning("rate limit of %s: Redis is back", self.provider)
                self._redis_down = False
                return wait
        return self._local()

    def _fall_back(self, exc: Exception) -> None:
        if not self._redis_down:
            with self._lock:  # the local bucket starts empty: no burst at the switch
                self._tokens, self._at = 0.0, time.monotonic()
            log.warning(
                "rate limit of %s: Redis unreachable (%s); limiting per process",
                self.provider,
                type(exc).__name__,
            )
        self._redis_down = True
        self._timeouts = 0
        self._retry_redis_at = time.monotonic() + REDIS_RETRY

    def _local(self) -> float:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return 0.0
            return (1 - self._tokens) / self.rate
