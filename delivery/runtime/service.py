"""The objects one worker or relay process holds: settings, database, provider clients,
circuit breakers, rate limits and the suppression list."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from delivery.config.settings import Settings
from delivery.guards.breaker import Breakers, CircuitBreaker
from delivery.guards.ratelimit import RateLimiter
from delivery.guards.redis_client import redis_client
from delivery.guards.suppression import Suppressions
from delivery.providers import Provider, build_provider
from delivery.runtime.db import make_engine, make_sessionmaker
from delivery.runtime.hooks import use_outcome_hooks

__all__ = ["Service"]


@dataclass
class Service:
    """Wires settings to an engine and to one pooled client per provider (built on first use,
    so that a forked worker child builds its own)."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    rng: random.Random = field(default_factory=random.Random)
    _providers: dict[str, Provider] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _breakers: Breakers | None = None
    _limiters: dict[str, RateLimiter | None] = field(default_factory=dict)
    _autocommit: Engine | None = None
    _suppressions: Suppressions | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Service:
        """The service of ``settings``; the app's outcome hooks they name are registered in
        this process (``delivery.runtime.hooks``: a ``ConfigError`` for a name that does not
        import)."""
        use_outcome_hooks(settings)
        engine = make_engine(settings.database_url)
        return cls(settings, engine, make_sessionmaker(engine))

    @property
    def autocommit(self) -> Engine:
        """The same engine and pool with each statement its own transaction: no ``BEGIN``,
        ``COMMIT`` or ``ROLLBACK`` round trips around it. For one statement alone: a read, or
        a fenced UPDATE that must be durable when it returns (the take before a send)."""
        if self._autocommit is None:
            self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        return self._autocommit

    @property
    def suppressions(self) -> Suppressions:
        """The suppression list as this process sees it (``delivery.guards.suppression``)."""
        with self._lock:
            if self._suppressions is None:
                self._suppressions = Suppressions(self.settings)
            return self._suppressions

    def provider(self, name: str) -> Provider:
        with self._lock:
            provider = self._providers.get(name)
            if provider is None:
                provider = self._providers[name] = build_provider(self.settings.providers[name])
            return provider

    def breaker(self, name: str) -> CircuitBreaker:
        """The provider's circuit breaker (shared through Redis when it is configured)."""
        with self._lock:
            if self._breakers is None:
                self._breakers = Breakers(self.settings)
            return self._breakers.get(name)

    def breaker_state(self, name: str) -> str:
        """The provider's breaker state as every worker sees it (a peek: it changes nothing)."""
        return self.breaker(name).status().state

    def limiter(self, name: str) -> RateLimiter | None:
        """The provider's shared rate limit, or None when it has none."""
        with self._lock:
            if name not in self._limiters:
                rate = self.settings.providers[name].rate_limit
                client = None
                if rate is not None and self.settings.redis_url is not None:
                    client = redis_client(self.settings.redis_url)
                self._limiters[name] = None if rate is None else RateLimiter(name, rate, client)
            return self._limiters[name]

    def close(self) -> None:
        with self._lock:
            for provider in self._providers.values():
                provider.close()
            self._providers.clear()
            if self._breakers is not None:
                self._breakers.close()
                self._breakers = None
        self.engine.dispose()
