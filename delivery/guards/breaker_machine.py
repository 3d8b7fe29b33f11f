"""The circuit breaker's state machine, twice: the Lua script Redis runs for every worker, and
its twin in this process's memory, step for step (``on_redis_error = "local"``, or no Redis);
``tests/test_breaker.py`` runs both through the same steps.

Each step takes an op (``allow``, ``record``, ``peek``, ``reset``), the caller's probe token, a
``Verdict``, what this process has to report since its last step (``successes``, which reset
the run of failures; ``released``: permits given back unused, taken off the window's calls)
and, for ``allow``, how many calls ask at once (``count``: closed counts them all, half-open
grants at most one probe). It answers a ``Reply``, whose ``next_at`` is when a refused caller
may ask again or, after a ``record`` that leaves the breaker open, its next probe time.

The rolling window is ``BUCKETS`` buckets of ``window / BUCKETS`` seconds, each holding the
calls and the transient failures that fell in it: constant space, exact to within one bucket.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from delivery.config.settings import BreakerConfig

__all__ = [
    "BUCKETS",
    "HALF_OPEN_POLL",
    "LUA",
    "BreakerState",
    "LocalMachine",
    "Reply",
    "Verdict",
    "decode",
    "probe_rule",
]

HALF_OPEN_POLL = 1.0
"""Seconds within which a caller turned away by a probe in flight is told to come back."""

BUCKETS = 10
"""Buckets of the rolling window."""


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Verdict(enum.StrEnum):
    """What one call says about the provider's health (``delivery.guards.breaker``)."""

    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"


class Reply(NamedTuple):
    """What one step of the state machine answers (the Lua script's reply, decoded)."""

    allowed: bool
    probe: bool  # allow: this caller holds the probe; peek: a probe is in flight
    from_state: str
    state: str
    failures: int  # transient failures in the window
    calls: int  # calls in the window
    next_at: float | None
    now: float


def probe_rule(probes: int, failure_rate: float) -> tuple[int, int]:
    """Half-open's closing rule for ``probes`` probes: ``(close_at, reopen_at)``. It reopens
    once ``reopen_at`` probes failed (their failure rate can no longer fall below
    ``failure_rate``) and closes once ``close_at`` succeeded (it can no longer reach it)."""
    reopen_at = max(1, math.ceil(probes * failure_rate - 1e-9))
    return probes - reopen_at + 1, reopen_at


def config_args(config: BreakerConfig, probe_ttl: float) -> tuple[Any, ...]:
    """The script's ARGV after op, token, verdict, successes and released."""
    close_at, reopen_at = probe_rule(config.half_open_probes, config.failure_rate)
    return (
        repr(config.failure_rate),
        config.minimum_calls,
        config.consecutive_failures,
        config.failure_threshold,
        repr(config.window),
        repr(config.reset_timeout),
        close_at,
        reopen_at,
        repr(probe_ttl),
        repr(HALF_OPEN_POLL),
        BUCKETS,
    )


# ARGV: op (allow | record | peek | reset), token, verdict (success | failure | neutral),
# successes, released, *config_args, count (allow: the calls asking at once). KEYS[1]: the hash.
LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local op, token, verdict = ARGV[1], ARGV[2], ARGV[3]
local successes, released = tonumber(ARGV[4]), tonumber(ARGV[5])
local rate, minimum = tonumber(ARGV[6]), tonumber(ARGV[7])
local in_a_row, threshold = tonumber(ARGV[8]), tonumber(ARGV[9])
local window, reset_timeout = tonumber(ARGV[10]), tonumber(ARGV[11])
local close_at, reopen_at = tonumber(ARGV[12]), tonumber(ARGV[13])
local probe_ttl, poll, nb = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local count = tonumber(ARGV[17]) or 1
local h = KEYS[1]
local function f(x) return string.format('%.6f', x) end
if op == 'reset' then
  local was = redis.call('HGET', h, 'state') or 'closed'
  redis.call('DEL', h)
  return {0, 0, was, 'closed', 0, 0, '', f(now)}
end
local v = redis.call('HMGET', h, 'state', 'open_until', 'probe', 'probe_until', 'passed',
                      'failed', 'streak')
local state = v[1] or 'closed'
local from = state
local open_until, probe = tonumber(v[2]) or 0, v[3] or ''
local probe_until, passed = tonumber(v[4]) or 0, tonumber(v[5]) or 0
local failed, streak = tonumber(v[6]) or 0, tonumber(v[7]) or 0
local idx = math.floor(now / (window / nb))
local slot = idx % nb
local names = {}
for i = 0, nb - 1 do
  names[#names + 1] = 't' .. i
  names[#names + 1] = 'c' .. i
  names[#names + 1] = 'f' .. i
end
local b = redis.call('HMGET', h, unpack(names))
local calls, fails, cur_c, cur_f = 0, 0, 0, 0
for i = 0, nb - 1 do
  local at = tonumber(b[3 * i + 1])
  if at ~= nil and at > idx - nb and at <= idx then
    local c, x = tonumber(b[3 * i + 2]) or 0, tonumber(b[3 * i + 3]) or 0
    calls, fails = calls + c, fails + x
    if i == slot and at == idx then cur_c, cur_f = c, x end
  end
end
local function bump(dc, df)
  local c = math.max(0, cur_c + dc)
  calls, fails = calls - cur_c + c, fails + df
  cur_c, cur_f = c, cur_f + df
  redis.call('HSET', h, 't' .. slot, string.format('%.0f', idx), 'c' .. slot, cur_c,
             'f' .. slot, cur_f)
end
if released > 0 then bump(-released, 0) end
if successes > 0 and streak > 0 then
  streak = 0
  redis.call('HSET', h, 'streak', 0)
end
local function open()
  state, open_until = 'open', now + reset_timeout
  redis.call('HSET', h, 'state', state, 'open_until', f(open_until), 'probe', '',
             'probe_until', 0, 'passed', 0, 'failed', 0, 'streak', 0)
end
local allowed, busy, next_at = 0, 0, ''
if probe ~= '' and now >= probe_until then probe = '' end
if op == 'allow' or op == 'peek' then
  if state == 'open' and now >= open_until then
    state, probe = 'half_open', ''
    if op == 'allow' then
      redis.call('HSET', h, 'state', state, 'passed', 0, 'failed', 0, 'probe', '',
                 'probe_until', 0)
    end
  end
  if state == 'closed' then
    allowed = 1
    if op == 'allow' then bump(count, 0) end
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
  if state == 'half_open' and token ~= '' and probe == token then
    if verdict == 'failure' then failed = failed + 1 end
    if verdict == 'success' then passed = passed + 1 end
    if failed >= reopen_at then
      open()
    elseif passed >= close_at then
      state = 'closed'
      redis.call('DEL', h)
      calls, fails = 0, 0
    else
      redis.call('HSET', h, 'probe', '', 'probe_until', 0, 'passed', passed, 'failed', failed)
    end
  elseif verdict == 'failure' then
    bump(0, 1)
    streak = streak + 1
    redis.call('HSET', h, 'streak', streak)
    if state == 'closed' and ((in_a_row > 0 and streak >= in_a_row)
        or (calls >= minimum and fails >= rate * calls)
        or (threshold > 0 and fails >= threshold)) then
      open()
    end
  end
  if state == 'open' then next_at = f(open_until) end
end
return {allowed, busy, from, state, fails, calls, next_at, f(now)}
"""


class LocalMachine:
    """The Lua script's state machine in this process's memory, step for step."""

    def __init__(self, config: BreakerConfig, probe_ttl: float, clock: Callable[[], float]):
        self._config, self._probe_ttl, self._clock = config, probe_ttl, clock
        self._close_at, self._reopen_at = probe_rule(config.half_open_probes, config.failure_rate)
        self._lock = threading.Lock()
        self._wipe()

    def _wipe(self) -> None:
        self._state = BreakerState.CLOSED.value
        self._open_until = self._probe_until = 0.0
        self._probe = ""
        self._passed = self._failed = self._streak = 0
        self._buckets: dict[int, list[int]] = {}  # slot -> [bucket index, calls, failures]

    def _open(self, now: float) -> None:
        self._state, self._open_until = BreakerState.OPEN.value, now + self._config.reset_timeout
        self._probe, self._probe_until = "", 0.0
        self._passed = self._failed = self._streak = 0

    def __call__(
        self,
        op: str,
        token: str,
        verdict: str,
        successes: int = 0,
        released: int = 0,
        *,
        count: int = 1,
    ) -> Reply:
        with self._lock:
            c, now = self._config, self._clock()
            if op == "reset":
                was = self._state
                self._wipe()
                return Reply(False, False, was, self._state, 0, 0, None, now)
            idx = math.floor(now / (c.window / BUCKETS))
            slot = idx % BUCKETS
            calls = fails = 0
            for at, n, x in self._buckets.values():
                if idx - BUCKETS < at <= idx:
                    calls, fails = calls + n, fails + x
            here = self._buckets.get(slot)
            current = here if here is not None and here[0] == idx else [idx, 0, 0]

            def bump(dc: int, df: int) -> None:
                nonlocal calls, fails
                n = max(0, current[1] + dc)
                calls, fails = calls - current[1] + n, fails + df
                current[1], current[2] = n, current[2] + df
                self._buckets[slot] = current

            if released > 0:
                bump(-released, 0)
            if successes > 0:
                self._streak = 0
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
                        self._state, self._passed, self._failed, self._probe = state, 0, 0, ""
                if state == BreakerState.CLOSED:
                    allowed = True
                    if op == "allow":
                        bump(count, 0)
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
                if state == BreakerState.HALF_OPEN and token != "" and probe == token:
                    self._failed += verdict == Verdict.FAILURE
                    self._passed += verdict == Verdict.SUCCESS
                    if self._failed >= self._reopen_at:
                        self._open(now)
                    elif self._passed >= self._close_at:
                        self._wipe()
                        calls = fails = 0
                    else:
                        self._probe, self._probe_until = "", 0.0
                elif verdict == Verdict.FAILURE:
                    bump(0, 1)
                    self._streak += 1
                    if state == BreakerState.CLOSED and (
                        (c.consecutive_failures > 0 and self._streak >= c.consecutive_failures)
                        or (calls >= c.minimum_calls and fails >= c.failure_rate * calls)
                        or (c.failure_threshold > 0 and fails >= c.failure_threshold)
                    ):
                        self._open(now)
                state = self._state
                if state == BreakerState.OPEN:
                    next_at = self._open_until
            return Reply(allowed, busy, start, state, fails, calls, next_at, now)


def decode(raw: Any) -> Reply:
    """The Lua script's reply as a ``Reply``."""
    allowed, busy, start, state, failures, calls, next_at, now = (
        value.decode() if isinstance(value, bytes) else value for value in raw
    )
    at = float(next_at) if next_at else None
    return Reply(
        bool(allowed), bool(busy), str(start), str(state), int(failures), int(calls), at, float(now)
    )
