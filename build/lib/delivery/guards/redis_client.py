"""The Redis client the guards share: it fails fast, so a send never waits on Redis."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["redis_client"]


def redis_client(url: str) -> redis.Redis:
    """A client that fails fast (0.5 s, one immediate retry): a send never waits on Redis."""
    return redis.Redis.from_url(
        url, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 1)
    )
