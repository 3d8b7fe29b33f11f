"""``CircuitBreaker.allow_many``: a batch's calls to one provider asked in one round trip, on
both machines (the Lua script on Redis and the local twin), answering what the same number of
callers asking one after another would get."""

from __future__ import annotations

import random
import time
from typing import Any

from delivery.guards.breaker import HALF_OPEN_POLL, Verdict
from tests.test_breaker import Backend, backend, opened

__all__ = ["backend"]  # the fixture, imported for the tests below

F, S, N = Verdict.FAILURE, Verdict.SUCCESS, Verdict.NEUTRAL


def test_closed_allows_and_counts_every_call(backend: Backend) -> None:
    b = backend.breaker()
    permits = b.allow_many(7)
    assert [p.allowed for p in permits] == [True] * 7
    assert not any(p.probe for p in permits)
    assert {p.source for p in permits} == {backend.kind}
    assert b.status().calls == 7
    b.release(permits[0])  # given back unused: off the window with the next step
    for permit in permits[1:]:
        b.record(permit, S)
    assert b.status().calls == 6
    assert b.allow_many(0) == []


def test_failures_of_many_permits_open_it_as_single_calls_would(backend: Backend) -> None:
    b = backend.breaker(consecutive_failures=0, minimum_calls=10, failure_rate=0.5)
    permits = b.allow_many(10)
    for permit in permits[:4]:
        b.record(permit, F)
    assert b.status().state == "closed"
    b.record(permits[4], F)  # 5 of 10: the rate rule
    assert b.status().state == "open"


def test_open_refuses_every_call_and_counts_none(backend: Backend) -> None:
    b = backend.breaker(consecutive_failures=2)
    opened(b)
    calls = b.status().calls
    permits = b.allow_many(5)
    assert not any(p.allowed for p in permits)
    assert {p.state for p in permits} == {"open"}
    assert len({p.retry_at for p in permits}) == 1 and permits[0].retry_at is not None
    assert b.status().calls == calls


def test_half_open_grants_one_probe_and_turns_the_rest_away(backend: Backend) -> None:
    b = backend.breaker(consecutive_failures=1, reset_timeout=0.2)
    opened(b)
    time.sleep(0.25)
    before = time.time()
    permits = b.allow_many(4)
    assert [(p.allowed, p.probe) for p in permits] == [(True, True)] + [(False, False)] * 3
    assert permits[0].token
    for p in permits[1:]:
        assert p.state == "half_open" and p.retry_at is not None
        assert before - 1 < p.retry_at <= time.time() + HALF_OPEN_POLL + 1
    # while the probe is in flight nobody else gets one
    assert not any(p.allowed for p in backend.peer().allow_many(3))
    b.record(permits[0], S)
    assert b.status().state == "half_open"
    assert b.allow_many(2)[0].probe  # the next probe, one at a time


def test_a_disabled_breaker_allows_many(backend: Backend) -> None:
    b = backend.breaker(enabled=False)
    assert [(p.allowed, p.source) for p in b.allow_many(3)] == [(True, "none")] * 3


def test_both_machines_answer_the_same_to_many_calls(redis_client: Any) -> None:
    """Property, seeded: 300 random steps of allow_many(0..6), each permit recorded with a
    random verdict or released, on the Lua script and on the local twin, give the same
    answers (permits, state, failures, calls)."""
    config = {"failure_rate": 0.5, "minimum_calls": 8, "consecutive_failures": 4}
    config["reset_timeout"] = 1000.0
    twins = [Backend("redis", redis_client), Backend("local", None)]
    rng = random.Random(5)
    try:
        pair = [t.breaker(**config) for t in twins]
        for step in range(300):
            count = rng.randrange(7)
            fates = [rng.choice([F, F, S, S, S, N, None]) for _ in range(count)]
            reset = rng.random() < 0.03
            answers = []
            for b in pair:
                if reset:
                    b.reset()
                permits = b.allow_many(count)
                for permit, fate in zip(permits, fates, strict=True):
                    if fate is None:
                        b.release(permit)
                    else:
                        b.record(permit, fate)
                status = b.status()
                seen = [(p.allowed, p.probe, p.state) for p in permits]
                answers.append((seen, status.state, status.failures, status.calls))
            assert answers[0] == answers[1], f"step {step}: {answers}"
    finally:
        twins[0].cleanup()
