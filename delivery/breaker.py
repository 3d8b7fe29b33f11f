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
import enum
import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from delivery.config import BreakerConfig, Settings

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
    "redis_client",
    "remove_breaker_hook",
]

log = logging.getLogger("delivery.breaker")

SUCCESS = frozenset({"delivered", "found", "absent", "undeliverable"})
FAILURE = frozenset({"retryable", "unknown", "lookup_failed"})
HALF_OPEN_POLL = 1.0
REDIS_RETRY = 5.0


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


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
_hooks: list[BreakerHook] = []


def add_breaker_hook(hook: BreakerHook) -> None:
    """Call ``hook`` with every transition this process makes (metrics, alerts)."""
    _hooks.append(hook)


def remove_breaker_hook(hook: BreakerHook) -> None:
    if hook in _hooks:
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
    for hook in list(_hooks):
        try:
            hook(transition)
        except Exception:
            log.exception("breaker hook %r failed", hook)


class _Reply(NamedTuple):
    """What one step of the state machine answers (the Lua script's reply, decoded)."""

    allowed: bool
    probe: bool  # allow: this caller holds the probe; peek: a probe is in flight
    from_state: str
    state: str
    failures: int
    next_at: float | None
    now: float


# ARGV: op (allow | record | peek | reset), token, verdict (success | failure | neutral),
# failure_threshold, window, reset_timeout, success_threshold, probe_ttl, half_open_poll.
_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local op, token, verdict = ARGV[1], ARGV[2], ARGV[3]
local threshold, window, reset_timeout = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local needed, probe_ttl, poll = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local h, z = KEYS[1], KEYS[2]
local function f(x) return string.format('%.6f', x) end
redis.call('ZREMRANGEBYSCORE', z, '-inf', '(' .. f(now - window))
local v = redis.call('HMGET', h, 'state', 'open_until', 'probe', 'probe_until', 'successes')
local state = v[1] or 'closed'
local from = state
local open_until, probe = tonumber(v[2]) or 0, v[3] or ''
local probe_until, successes = tonumber(v[4]) or 0, tonumber(v[5]) or 0
local allowed, busy, next_at = 0, 0, ''
if probe ~= '' and now >= probe_until then probe = '' end
if op == 'allow' or op == 'peek' then
  if state == 'open' and now >= open_until then
    state, probe = 'half_open', ''
    if op == 'allow' then
      redis.call('HSET', h, 'state', state, 'successes', 0, 'probe', '', 'probe_until', 0)
    end
  end
  if state == 'closed' then
    allowed = 1
  elseif state == 'open' then
    next_at = f(open_until)
  elseif probe ~= '' then
    busy = 1
    next_at = f(probe_until)
    if op == 'allow' then next_at = f(math.min(probe_until, now + poll)) end
  elseif op == 'allow' then
    allowed, busy = 1, 1
    redis.call('HSET', h, 'probe', token, 'probe_until', f(now + probe_ttl))
  else
    next_at = f(now)
  end
elseif op == 'record' then
  local mine = state == 'half_open' and token ~= '' and probe == token
  if verdict == 'failure' then
    local seq = redis.call('HINCRBY', h, 'seq', 1)
    redis.call('ZADD', z, f(now), f(now) .. '#' .. seq)
    redis.call('EXPIRE', z, math.ceil(window) + 1)
    if mine or (state == 'closed' and redis.call('ZCARD', z) >= threshold) then
      state = 'open'
      redis.call('HSET', h, 'state', state, 'open_until', f(now + reset_timeout),
                 'probe', '', 'probe_until', 0, 'successes', 0)
    end
  elseif mine and verdict == 'success' and successes + 1 >= needed then
    state = 'closed'
    redis.call('DEL', z)
    redis.call('HSET', h, 'state', state, 'open_until', 0, 'probe', '', 'probe_until', 0,
               'successes', 0)
  elseif mine then
    if verdict == 'success' then successes = successes + 1 end
    redis.call('HSET', h, 'probe', '', 'probe_until', 0, 'successes', successes)
  end
elseif op == 'reset' then
  redis.call('DEL', h, z)
  state = 'closed'
end
return {allowed, busy, from, state, redis.call('ZCARD', z), next_at, f(now)}
"""


class _Local:
    """The Lua script's state machine in this process's memory, step for step."""

    def __init__(self, config: BreakerConfig, probe_ttl: float, clock: Callable[[], float]):
        self._config, self._probe_ttl, self._clock = config, probe_ttl, clock
        self._lock = threading.Lock()
        self._failures: deque[float] = deque()
        self._state = BreakerState.CLOSED.value
        self._open_until = self._probe_until = 0.0
        self._probe = ""
        self._successes = 0

    def __call__(self, op: str, token: str, verdict: str) -> _Reply:
        with self._lock:
            return self._step(op, token, verdict)

    def _open(self, now: float) -> None:
        self._state, self._open_until = BreakerState.OPEN.value, now + self._config.reset_timeout
        self._probe, self._probe_until, self._successes = "", 0.0, 0

    def _step(self, op: str, token: str, verdict: str) -> _Reply:
        c, now = self._config, self._clock()
        while self._failures and self._failures[0] < now - c.window:
            self._failures.popleft()
        state = start = self._state
        if self._probe and now >= self._probe_until:
            self._probe = ""
        probe = self._probe
        allowed = busy = False
        next_at: float | None = None
        if op in ("allow", "peek"):
            if state == BreakerState.OPEN and now >= self._open_until:
                state, probe = BreakerState.HALF_OPEN.value, ""
                if op == "allow":
                    self._state, self._successes, self._probe = state, 0, ""
            if state == BreakerState.CLOSED:
                allowed = True
            elif state == BreakerState.OPEN:
                next_at = self._open_until
            elif probe:
                busy = True
                poll = self._probe_until if op == "peek" else now + HALF_OPEN_POLL
                next_at = min(self._probe_until, poll)
            elif op == "allow":
                allowed = busy = True
                self._probe, self._probe_until = token, now + self._probe_ttl
            else:
                next_at = now
        elif op == "record":
            mine = state == BreakerState.HALF_OPEN and token != "" and probe == token
            if verdict == "failure":
                self._failures.append(now)
                if mine or (
                    state == BreakerState.CLOSED and len(self._failures) >= c.failure_threshold
                ):
                    self._open(now)
            elif mine and verdict == "success" and self._successes + 1 >= c.success_threshold:
                self._failures.clear()
                self._state, self._open_until, self._probe, self._successes = "closed", 0.0, "", 0
            elif mine:
                if verdict == "success":
                    self._successes += 1
                self._probe = ""
            state = self._state
        elif op == "reset":
            self._failures.clear()
            self._state, self._open_until, self._probe, self._successes = "closed", 0.0, "", 0
            state = self._state
        return _Reply(allowed, busy, start, state, len(self._failures), next_at, now)


def _decode(raw: Any) -> _Reply:
    allowed, busy, start, state, failures, next_at, now = raw

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    return _Reply(
        bool(allowed),
        bool(busy),
        text(start),
        text(state),
        int(failures),
        float(text(next_at)) if text(next_at) else None,
        float(text(now)),
    )


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
        self._local = _Local(config, probe_ttl, clock)
        self._script = None if client is None else client.register_script(_LUA)
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
    ) -> tuple[_Reply | None, str]:
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
                return self._announced(op, _decode(raw), "redis"), "redis"
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

    def _announced(self, op: str, reply: _Reply, source: str) -> _Reply:
        if op != "peek" and reply.from_state != reply.state:
            at = dt.datetime.fromtimestamp(reply.now, dt.UTC)
            _announce(
                BreakerTransition(
                    self.provider, reply.from_state, reply.state, reply.failures, at, source
                )
            )
        return reply


def redis_client(url: str) -> redis.Redis:
    """A client that fails fast (0.5 s, one immediate retry): a send never waits on Redis."""
    return redis.Redis.from_url(
        url, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 1)
    )


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
