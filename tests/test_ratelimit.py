"""The per-provider rate limit, shared through Redis by every worker process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import delivery
from delivery.config.loading import load_settings
from delivery.guards.ratelimit import RateLimiter
from delivery.runtime.db import make_engine, upgrade
from delivery.testing.processes import beat, worker
from tests.conftest import PG_DB, PG_SERVER, REDIS_URL, RUN_DIR, STUB_PORT, drained

pytestmark = pytest.mark.integration
RATE = 25.0


def test_bucket_is_shared_between_limiters(redis_client: redis.Redis) -> None:
    """Two limiters (as two processes) draw from one bucket: the burst is spent once."""
    redis_client.flushdb()
    first = RateLimiter("shared", 10.0, redis.Redis.from_url(REDIS_URL))
    second = RateLimiter("shared", 10.0, redis.Redis.from_url(REDIS_URL))
    waits = [(first if i % 2 else second).acquire() for i in range(10)]
    assert waits == [0.0] * 10
    wait = first.acquire()
    assert 0.0 < wait <= 0.1 + 1e-6
    time.sleep(wait)
    assert second.acquire() == 0.0


def test_unreachable_redis_falls_back_to_a_local_bucket() -> None:
    """With Redis down the limiter keeps limiting in-process at the rate and never raises;
    its local bucket starts empty, so the switch adds no burst."""
    limiter = RateLimiter("down", 5.0, redis.Redis(port=1, socket_connect_timeout=0.2))
    wait = limiter.acquire()
    assert 0.0 < wait <= 0.2 + 1e-6
    time.sleep(wait)
    assert limiter.acquire() == 0.0
    assert limiter.acquire() > 0.0


def test_slow_redis_makes_the_caller_wait_not_burst() -> None:
    """A Redis that times out is not taken for down at once: the caller waits one token's
    time (the token may have been taken), and only repeated timeouts switch to local."""
    from delivery.guards import ratelimit

    class Slow(redis.Redis):  # type: ignore[type-arg]
        def register_script(self, script):  # type: ignore[no-untyped-def]
            def run(**_: object) -> None:
                raise redis.TimeoutError("Timeout reading from socket")

            return run

    limiter = RateLimiter("slow", 10.0, Slow())
    waits = [limiter.acquire() for _ in range(ratelimit.TIMEOUTS_BEFORE_LOCAL - 1)]
    assert waits == [0.1] * (ratelimit.TIMEOUTS_BEFORE_LOCAL - 1)
    assert limiter.acquire() > 0.0  # now local, and empty: still no burst


@pytest.fixture
def rate_limited(
    tmp_path: Path, pg_engine: Engine, redis_client: redis.Redis
) -> Iterator[tuple[Engine, dict[str, str]]]:
    """Its own outbox and broker (so the suite's pipeline never sees these rows), the suite's
    stub provider, and a config with rate_limit on the provider."""
    name = f"{PG_DB}_rate"
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        conn.execute(text(f"CREATE DATABASE {name}"))
    config = tmp_path / "rate.toml"
    config.write_text(f"""
[delivery]
relay_interval = 0.2
sweep_interval = 1.0

[timeouts]
connect = 1
read = 3

[providers.limited]
kind = "http"
base_url = "http://127.0.0.1:{STUB_PORT}"
rate_limit = {RATE}

[channels.sms]
provider = "limited"
""")
    env = {
        "DELIVERY_DATABASE_URL": f"{PG_SERVER}/{name}",
        # The suite's shared-state db doubles as this cluster's broker: the suite's worker
        # listens on another db, and kombu's keys do not meet the rate limiter's.
        "DELIVERY_BROKER_URL": REDIS_URL,
        "DELIVERY_REDIS_URL": REDIS_URL,
        "DELIVERY_CONFIG": str(config),
        "DELIVERY_HOME": str(tmp_path / "home"),
    }
    redis_client.flushdb()
    engine = make_engine(env["DELIVERY_DATABASE_URL"])
    upgrade(engine)
    yield engine, env
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


def test_two_workers_together_stay_within_the_rate(rate_limited, stub, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two worker processes sending 150 messages keep the provider's received rate within
    rate_limit (after the one-second burst), and every message is sent once."""
    import os

    from delivery.outbox import enqueue as outbox

    # This outbox has its own broker: the suite's nudge (installed when another module imports
    # tasks) would publish these rows to the suite's broker instead. The beat relay sends them.
    monkeypatch.setattr(outbox, "_nudge", None)
    stub.reset()  # no faults left over from another test

    engine, overrides = rate_limited
    env = {**os.environ, **overrides}
    settings = load_settings(env)
    logs = RUN_DIR / "ratelimit"
    procs = [
        worker(logs / "w1.log", env=env, pool="threads", concurrency=4, name="rate1").start(),
        worker(logs / "w2.log", env=env, pool="prefork", concurrency=2, name="rate2").start(),
    ]
    try:
        with Session(engine) as session, session.begin():
            for i in range(150):
                delivery.enqueue(
                    session,
                    channel="sms",
                    to=f"+1201555{i:04d}",
                    payload={"body": "x"},
                    key=f"rate-{i}",
                    settings=settings,
                )
        procs.append(beat(logs / "beat.log", logs / "schedule", env=env).start())
        drained(engine, 150, timeout=120)
    finally:
        for proc in procs:
            proc.stop()
    times = sorted(r["at"] for r in stub.requests() if r["key"].startswith("rate-"))
    assert len(times) == 150 and set(stub.effects().values()) == {1}
    # The bucket's promise: in any span of w seconds at most one second's worth (the burst it
    # starts with) plus RATE * w requests. Measured at the stub, a request may arrive up to
    # JITTER s later than its token was taken, so a span holds up to RATE * JITTER more. (Not
    # a mean rate after the first RATE requests: tokens that accrue while the burst is sent
    # belong to the burst, and a slow start moves them into that mean.)
    # 0.25 s was exceeded once by 0.005 in a loaded full run (2026-12-06: 31.25 in a span): a
    # stall of the stub's or a worker's process bunches arrivals. A limiter 1.3x too fast
    # still fails by far (about 54 in the span of all 150 requests against 35).
    jitter = 0.4
    worst = max(
        (j - i + 1) - RATE * (times[j] - times[i])
        for i in range(len(times))
        for j in range(i, len(times))
    )
    assert worst <= RATE * (1 + jitter), (worst, times)
    steady = times[int(RATE) :]
    rate = (len(steady) - 1) / (steady[-1] - steady[0])
    assert rate >= RATE * 0.5, rate  # limited, not starved
