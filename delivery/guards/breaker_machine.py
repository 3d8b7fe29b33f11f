"""The circuit breaker's state machine, twice: the Lua script Redis runs for every worker, and
its twin in this process's memory, step for step (``on_redis_error = "local"``, or no Redis).

Each step takes an op (``allow``, ``record``, ``peek``, ``reset``), the caller's probe token
and a verdict (``success``, ``failure``, ``neutral``), and answers a ``Reply``. The states and
transitions are drawn in ``delivery.guards.breaker``'s docstring; ``tests/test_breaker.py``
runs both machines through the same steps.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from delivery.config.settings import BreakerConfig

__all__ = ["HALF_OPEN_POLL", "LUA", "BreakerState", "LocalMachine", "Reply", "decode"]

HALF_OPEN_POLL = 1.0
"""Seconds within which a caller turned away by a probe in flight is told to come back."""


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Reply(NamedTuple):
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
LUA = """
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


class LocalMachine:
    """The Lua script's state machine in this process's memory, step for step."""

    def __init__(self, config: BreakerConfig, probe_ttl: float, clock: Callable[[], float]):
        self._config, self._probe_ttl, self._clock = config, probe_ttl, clock
        self._lock = threading.Lock()
        self._failures: deque[float] = deque()
        self._state = BreakerState.CLOSED.value
        self._open_until = self._probe_until = 0.0
        self._probe = ""
        self._successes = 0

    def __call__(self, op: str, token: str, verdict: str) -> Reply:
        with self._lock:
            return self._step(op, token, verdict)

    def _open(self, now: float) -> None:
        self._state, self._open_until = BreakerState.OPEN.value, now + self._config.reset_timeout
        self._probe, self._probe_until, self._successes = "", 0.0, 0

    def _step(self, op: str, token: str, verdict: str) -> Reply:
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
        return Reply(allowed, busy, start, state, len(self._failures), next_at, now)


def decode(raw: Any) -> Reply:
    allowed, busy, start, state, failures, next_at, now = raw

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    return Reply(
        bool(allowed),
        bool(busy),
        text(start),
        text(state),
        int(failures),
        float(text(next_at)) if text(next_at) else None,
        float(text(now)),
    )
