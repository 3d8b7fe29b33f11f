"""A circuit breaker per provider, shared by every worker process through Redis
(docs/concepts.md, "Circuit breaker", says what it does and what counts as a failure)::

    closed ──the window's failure rate, or a run of failures, says outage──▶ open
    open ──reset_timeout s passed; the next caller──▶ half_open
    half_open ──probes, one at a time, until their failure rate decides──▶ closed | open
    any ──`delivery breaker reset PROVIDER`──▶ closed

**Why a rate and these defaults** (``BreakerConfig``). A count alone does not scale with
traffic (at 100 msg/s five failures a minute are 0.08%); a rate does, and a provider that
loses 30% of its answers must stay closed. At ``minimum_calls`` (40) the rate rule trips it
falsely with P(Binomial(40, 0.3) >= 20) = 0.6% (0.8% over the ramp from 40 to 80 calls, by
simulation), against 4.8% (5.8%) with a minimum of 20; at 100 calls in the window it is 2e-5,
and with 15% failures (503s) 2e-7 at 40 calls. The run rule (``consecutive_failures``, 10)
finds a dead provider in a constant number of requests at any volume, also when the window
is full of earlier successes; it trips a 30%-failing provider once in 1/(0.7 * 0.3^10) =
240,000 calls (about 1.5 times an hour at 100 msg/s), a 15%-failing one once in 2e8 calls.
A full outage costs 10 failures to trip, plus the calls in flight (at most the worker slots
minus one), plus ``reopen_at`` probes (3) per reset_timeout.

**Half-open.** ``half_open_probes`` (5) probes, one at a time: it closes as soon as their
failure rate can no longer reach ``failure_rate`` (3 successes of 5) and reopens as soon as
it cannot fall below it (3 failures of 5): ``breaker_machine.probe_rule``. A 70%-healthy
provider closes at the first episode with P(Binomial(5, 0.7) >= 3) = 84% and then stays
closed; a dead one costs 3 requests per episode. Closing forgets the window and the run.
The probe token expires after ``probe_ttl`` (the send lease), so a worker that died mid-probe
does not wedge it; callers behind a probe in flight come back within ``HALF_OPEN_POLL`` s.

**Round trips.** The state is one Redis hash (``delivery:breaker:{NAME}``), changed only by
one Lua script on Redis's own clock: one EVALSHA before a send (``allow``, or ``allow_many``
for a batch's calls to one provider), and one after it only for a failure or a probe. A plain
success, or a permit released unused, is reported with this process's next step. If Redis
is unreachable, ``on_redis_error`` decides (``local``: the same rules in this process;
``allow``: no breaker); Redis is tried again after ``REDIS_RETRY`` s.
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
    Verdict,
    config_args,
    decode,
)
from delivery.guards.redis_client import redis_client
from delivery.observability.events import Hooks

__all__ = [
    "HALF_OPEN_POLL",
    "REDIS_RETRY",
    "BreakerHook",
    "BreakerState",
    "BreakerStatus",
    "BreakerTransition",
    "Breakers",
    "CircuitBreaker",
    "Permit",
    "Recorded",
    "Verdict",
    "add_breaker_hook",
    "remove_breaker_hook",
]

log = logging.getLogger("delivery.breaker")

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
    ``local``, or ``none`` (no breaker: ``enabled = false``, or Redis unreachable and
    ``on_redis_error = "allow"``)."""

    allowed: bool
    state: str
    source: str
    probe: bool = False
    token: str = ""
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """``record``'s answer. ``probe_failed``: the call was the half-open probe and it failed (the
    breaker's test of the provider, not the message's own try: its attempt is given back).
    ``retry_at`` (epoch seconds): the breaker is open after this call, and turns callers away
    until then (its next probe time); None: it is not open."""

    probe_failed: bool = False
    retry_at: float | None = None


_NOTHING = Recorded()


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    """A breaker as ``peek`` sees it: ``failures`` and ``calls`` in the rolling window."""

    provider: str
    state: str
    failures: int
    next_probe_at: float | None
    probe_in_flight: bool
    source: str
    calls: int = 0


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
        self._poll = min(HALF_OPEN_POLL, probe_ttl)
        self._script = None if client is None else client.register_script(LUA)
        self._keys = [f"delivery:breaker:{{{provider}}}"]
        self._args = config_args(config, probe_ttl)
        self._retry_redis_at = 0.0
        self._degraded = False
        self._pending = threading.Lock()
        self._successes = self._released = 0  # reported with this process's next step

    def allow(self) -> Permit:
        """May this provider be called now? One Redis round trip (it counts the call)."""
        return self.allow_many(1)[0]

    def allow_many(self, count: int) -> list[Permit]:
        """``allow`` for ``count`` calls at once, in one Redis round trip: what ``count``
        callers asking one after another would get. Closed: every call is allowed and counted;
        open: none; half-open: the first holds the probe if none is in flight, and the others
        are turned away as callers behind a probe in flight are (back within
        ``HALF_OPEN_POLL`` s)."""
        if count <= 0:
            return []
        if not self.config.enabled:
            return [Permit(True, "disabled", "none")] * count
        token = secrets.token_hex(8)
        reply, source = self._run("allow", token, "", count=count)
        if reply is None:
            return [Permit(True, "unknown", source)] * count
        if not (reply.allowed and reply.probe):
            return [Permit(reply.allowed, reply.state, source, retry_at=reply.next_at)] * count
        probe = Permit(True, reply.state, source, True, token)
        behind = Permit(False, reply.state, source, retry_at=reply.now + self._poll)
        return [probe, *[behind] * (count - 1)]

    def record(self, permit: Permit, verdict: Verdict) -> Recorded:
        """Count one call's verdict. A failure or the probe's answer is one round trip; a
        plain success is reported with this process's next step, a neutral answer never. The
        answer says whether a probe failed and, after a failure, until when the breaker is
        open (the sender does not retry the message before then: it would only be parked)."""
        verdict = Verdict(verdict)
        if permit.source == "none":
            return _NOTHING
        if verdict == Verdict.FAILURE or permit.probe:
            reply, _ = self._run("record", permit.token, verdict, local=permit.source == "local")
            probe_failed = permit.probe and verdict == Verdict.FAILURE
            return Recorded(probe_failed, None if reply is None else reply.next_at)
        if verdict == Verdict.SUCCESS:
            with self._pending:
                self._successes += 1
        return _NOTHING

    def release(self, permit: Permit) -> None:
        """Give back a permit that was never used (the row was taken by another worker): a
        probe is freed at once, a plain call is taken off the window with the next step."""
        if permit.probe:
            self.record(permit, Verdict.NEUTRAL)
        elif permit.source != "none":
            with self._pending:
                self._released += 1

    def status(self) -> BreakerStatus:
        if not self.config.enabled:
            return BreakerStatus(self.provider, "disabled", 0, None, False, "none")
        reply, source = self._run("peek", "", "")
        if reply is None:
            return BreakerStatus(self.provider, "unknown", 0, None, False, source)
        return BreakerStatus(
            self.provider,
            reply.state,
            reply.failures,
            reply.next_at,
            reply.probe,
            source,
            reply.calls,
        )

    def reset(self) -> str:
        """Close the breaker and forget its window; return the state it was in."""
        reply, _ = self._run("reset", "", "")
        return "unknown" if reply is None else reply.from_state

    def _take(self) -> tuple[int, int]:
        with self._pending:
            taken = (self._successes, self._released)
            self._successes = self._released = 0
        return taken

    def _run(
        self, op: str, token: str, verdict: str, *, local: bool = False, count: int = 1
    ) -> tuple[Reply | None, str]:
        successes, released = self._take()
        if self._script is not None and not local and time.monotonic() >= self._retry_redis_at:
            argv = [op, token, verdict, successes, released, *self._args, count]
            try:
                raw = self._script(keys=self._keys, args=argv)
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
        reply = self._local(op, token, verdict, successes, released, count=count)
        return self._announced(op, reply, "local"), "local"

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
