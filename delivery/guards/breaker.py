"""A circuit breaker per provider, shared by every worker process through Redis (DESIGN 6).

::

    closed ──failure_threshold transient failures inside `window` s──▶ open
    open ──reset_timeout s passed; the next caller──▶ half_open
    half_open ──the probe succeeds, success_threshold times──▶ closed  (failure window cleared)
    half_open ──the probe fails──▶ open                                (another reset_timeout)
    any ──`delivery breaker reset PROVIDER`──▶ closed

Transient failures are the outcomes ``retryable`` and ``unknown`` (connect errors, timeouts,
5xx, 429) and a failed lookup; ``permanent`` ones (4xx, bad recipient, key reused) never
count. A success while closed does not clear the failure window: only age does.

In ``half_open`` one caller at a time holds the probe token. The token expires after
``probe_ttl`` seconds (the send lease), so a worker that died mid-probe does not wedge it.
Callers turned away by a probe in flight are told to come back within ``HALF_OPEN_POLL`` s.

The state is a Redis hash (``delivery:breaker:{NAME}``) and a sorted set of failure times
(``delivery:breaker:{NAME}:failures``), changed only by one Lua script on Redis's own clock:
one EVALSHA before a send (``allow``) and one after (``record``). If Redis is unreachable,
``on_redis_error`` decides: ``local`` (default) applies the same rules in this process only,
``allow`` sends with no breaker. Either way the worker logs it once and goes on; Redis is
tried again after ``REDIS_RETRY`` s. With no ``DELIVERY_REDIS_URL`` every breaker is local.

Every transition is one JSON line on the ``delivery.breaker`` logger and a frozen
``BreakerTransition`` passed to the hooks registered with ``add_breaker_hook``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from delivery.config.settings import BreakerConfig, Settings
from delivery.guards.breaker_machine import (
    HALF_OPEN_POLL,
    LUA,
    BreakerState,
    LocalMachine,
    Reply,
    decode,
)
from delivery.guards.redis_client import redis_client
from delivery.observability.events import Hooks

__all__ = [
    "FAILURE",
    "HALF_OPEN_POLL",
    "REDIS_RETRY",
    "SUCCESS",
    "BreakerHook",
    "BreakerState",
    "BreakerStatus",
    "BreakerTransition",
    "Breakers",
    "CircuitBreaker",
    "Permit",
    "add_breaker_hook",
    "remove_breaker_hook",
]

log = logging.getLogger("delivery.breaker")

SUCCESS = frozenset({"delivered", "found", "absent", "undeliverable"})
FAILURE = frozenset({"retryable", "unknown", "lookup_failed"})
REDIS_RETRY = 5.0


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """One state change. ``source``: ``redis`` (shared) or ``local`` (this process only)."""

    provider: str
    from_state: str
    to_state: str
    failures: int
    at: dt.datetime
    source: str


@dataclass(frozen=True, slots=True)
class Permit:
    """``allow``'s answer. ``probe``: this call is the half-open probe and its outcome decides.
    ``retry_at`` (epoch seconds): when a refused caller may ask again. ``source``: ``redis``,
    ``local``, or ``none`` (Redis unreachable and ``on_redis_error = "allow"``)."""

    allowed: bool
    state: str
    source: str
    probe: bool = False
    token: str = ""
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    provider: str
    state: str
    failures: int
    next_probe_at: float | None
    probe_in_flight: bool
    source: str


BreakerHook = Callable[[BreakerTransition], None]
_hooks: Hooks[BreakerTransition] = Hooks(log, "breaker hook")


def add_breaker_hook(hook: BreakerHook) -> None:
    """Call ``hook`` with every transition this process makes (metrics, alerts)."""
    _hooks.add(hook)


def remove_breaker_hook(hook: BreakerHook) -> None:
    _hooks.remove(hook)


def _announce(transition: BreakerTransition) -> None:
    level = logging.WARNING if transition.to_state == BreakerState.OPEN else logging.INFO
    if log.isEnabledFor(level):
        event = {
            "event": "breaker_transition",
            "provider": transition.provider,
            "from": transition.from_state,
            "to": transition.to_state,
            "failures": transition.failures,
            "at": transition.at.isoformat(),
            "source": transition.source,
        }
        log.log(level, json.dumps(event))
    _hooks.call(transition)


class CircuitBreaker:
    """One provider's breaker: Redis when ``client`` is given, else this process only."""

    def __init__(
        self,
        provider: str,
        config: BreakerConfig,
        *,
        client: redis.Redis | None = None,
        probe_ttl: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.provider, self.config = provider, config
        self._local = LocalMachine(config, probe_ttl, clock)
        self._script = None if client is None else client.register_script(LUA)
        key = f"delivery:breaker:{{{provider}}}"
        self._keys = [key, f"{key}:failures"]
        self._args = (
            config.failure_threshold,
            config.window,
            config.reset_timeout,
            config.success_threshold,
            probe_ttl,
            HALF_OPEN_POLL,
        )
        self._retry_redis_at = 0.0
        self._degraded = False

    def allow(self) -> Permit:
        """May this provider be called now? One Redis round trip."""
        token = secrets.token_hex(8)
        reply, source = self._run("allow", token, "")
        if reply is None:
            return Permit(True, "unknown", source)
        probe = reply.allowed and reply.probe
        return Permit(
            reply.allowed, reply.state, source, probe, token if probe else "", reply.next_at
        )

    def record(self, permit: Permit, outcome_kind: str) -> None:
        """Count one call's outcome (``Outcome.kind``): success, failure or neither."""
        verdict = (
            "success"
            if outcome_kind in SUCCESS
            else "failure"
            if outcome_kind in FAILURE
            else "neutral"
        )
        # Only a failure, or the probe's own answer, changes the state: a plain success or a
        # neutral answer costs no round trip.
        if permit.source != "none" and (verdict == "failure" or permit.probe):
            self._run("record", permit.token, verdict, local=permit.source == "local")

    def release(self, permit: Permit) -> None:
        """Give back a probe that was never used (the row was taken by another worker)."""
        self.record(permit, "released")

    def status(self) -> BreakerStatus:
        reply, source = self._run("peek", "", "")
        if reply is None:
            return BreakerStatus(self.provider, "unknown", 0, None, False, source)
        return BreakerStatus(
            self.provider, reply.state, reply.failures, reply.next_at, reply.probe, source
        )

    def reset(self) -> str:
        """Close the breaker and forget its failures; return the state it was in."""
        reply, _ = self._run("reset", "", "")
        return "unknown" if reply is None else reply.from_state

    def _run(
        self, op: str, token: str, verdict: str, *, local: bool = False
    ) -> tuple[Reply | None, str]:
        if self._script is not None and not local and time.monotonic() >= self._retry_redis_at:
            try:
                raw = self._script(keys=self._keys, args=[op, token, verdict, *self._args])
            except (redis.RedisError, OSError) as exc:
                self._redis_failed(exc)
            else:
                if self._degraded:
                    self._degraded = False
                    log.warning(
                        json.dumps({"event": "breaker_redis_ok", "provider": self.provider})
                    )
                return self._announced(op, decode(raw), "redis"), "redis"
        if self._script is not None and not local and self.config.on_redis_error == "allow":
            return None, "none"
        return self._announced(op, self._local(op, token, verdict), "local"), "local"

    def _redis_failed(self, exc: BaseException) -> None:
        self._retry_redis_at = time.monotonic() + REDIS_RETRY
        if not self._degraded:
            self._degraded = True
            event = {
                "event": "breaker_redis_error",
                "provider": self.provider,
                "error": f"{type(exc).__name__}: {exc}"[:300],
                "fallback": self.config.on_redis_error,
                "retry_in": REDIS_RETRY,
            }
            log.warning(json.dumps(event))

    def _announced(self, op: str, reply: Reply, source: str) -> Reply:
        if op != "peek" and reply.from_state != reply.state:
            at = dt.datetime.fromtimestamp(reply.now, dt.UTC)
            _announce(
                BreakerTransition(
                    self.provider, reply.from_state, reply.state, reply.failures, at, source
                )
            )
        return reply


class Breakers:
    """This process's breakers, one per configured provider, built on first use."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.client = None if settings.redis_url is None else redis_client(settings.redis_url)
        self._clock = clock
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, provider: str) -> CircuitBreaker:
        with self._lock:
            breaker = self._breakers.get(provider)
            if breaker is None:
                breaker = self._breakers[provider] = CircuitBreaker(
                    provider,
                    self.settings.providers[provider].breaker,
                    client=self.client,
                    probe_ttl=self.settings.send_lease,
                    clock=self._clock,
                )
            return breaker

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
