"""The circuit breaker's bound on a backlog: a provider outage at the start of a backlog that
travels in batches costs at most the run that trips the breaker, the sends already in flight
and the probes of each ``reset_timeout``, through a real worker, beat, Redis (broker and
breaker store) and the stub provider over HTTP.

The rig has its own database, stub and this slot's shared-state Redis db, so that no other
worker or relay of the suite can take its messages.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from delivery.config.loading import load_settings
from delivery.config.settings import BreakerConfig, Settings
from delivery.guards.breaker_machine import probe_rule
from delivery.outbox import enqueue as outbox
from delivery.outbox.bulk import enqueue_many
from delivery.testing.processes import ServiceProcess, beat, start_all, stop_all, stub_provider
from delivery.testing.processes import worker as worker_process
from delivery.testing.stub_provider import StubClient
from tests.conftest import drained, free_port, own_outbox

pytestmark = pytest.mark.integration

BACKLOG = 100
OUTAGE = 15.0
RESET = 5.0  # reset_timeout; every other breaker setting is the default
THREADS = 4  # the worker's task threads; its send pool has the default send_concurrency
RUN = BreakerConfig().consecutive_failures
PROBES = probe_rule(BreakerConfig().half_open_probes, BreakerConfig().failure_rate)[1]

TOML = """
[delivery]
relay_interval = 0.2
sweep_interval = 0.5

[providers.down]
kind = "http"
base_url = "http://127.0.0.1:{port}"

[providers.down.breaker]
reset_timeout = {reset}

[channels.sms]
provider = "down"
"""


@pytest.fixture(scope="module")
def rig(
    pg_engine: Engine, redis_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, StubClient, Settings, Any]]:
    """Own database and stub; one worker (threads) and beat on this slot's shared-state Redis
    db as broker and breaker store."""
    run = tmp_path_factory.mktemp("backlog")
    port = free_port()
    config = run / "backlog.toml"
    config.write_text(TOML.format(port=port, reset=RESET))
    redis_client.flushdb()
    log = run / "worker.log"
    procs: list[ServiceProcess] = []
    with own_outbox("backlog", run, config) as (engine, env):
        try:
            procs = start_all(
                [
                    stub_provider(run / "stub.log", port),
                    worker_process(log, env=env, concurrency=THREADS, name="backlog"),
                    beat(run / "beat.log", run / "beat-schedule", env=env),
                ]
            )
            with StubClient(f"http://127.0.0.1:{port}") as stub:
                yield engine, stub, load_settings(env), log
        finally:
            stop_all(procs[::-1])
            redis_client.flushdb()


def test_an_outage_during_a_backlog_costs_the_breakers_bound(
    rig: tuple[Engine, StubClient, Settings, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 15 s outage (every POST 503) from the moment a 100-message backlog is committed, the
    default breaker with ``reset_timeout = 5``: the backlog goes out in batches, and the
    provider sees at most the run that opens the breaker (10), one send per worker slot that
    was already under way (the task threads, which send a message alone, and the send pool)
    and the probes that reopen it (3) per reset_timeout; every message is sent once it is
    back. A batch asking the breaker once for all its messages sent all 100."""
    engine, stub, settings, log = rig
    monkeypatch.setattr(outbox, "_nudge", None)  # the rig's beat publishes, not the suite's
    stub.set_faults(error_rate=1.0, error_status=503)
    started = time.time()
    with Session(engine) as session, session.begin():
        specs = (
            {"channel": "sms", "to": f"+1201555{i:04d}", "payload": {"body": "x"}, "key": f"b-{i}"}
            for i in range(BACKLOG)
        )
        enqueue_many(session, specs, settings=settings)
    time.sleep(max(0.0, started + OUTAGE - time.time()))
    stub.set_faults(error_rate=0.0)
    recovered = time.time()
    assert drained(engine, BACKLOG, timeout=90) == {"sent": BACKLOG}

    during = [r for r in stub.requests() if r["at"] < recovered]
    slots = THREADS + settings.send_concurrency
    bound = RUN + slots + PROBES * math.ceil(OUTAGE / RESET)
    print(f"\n{len(during)} provider requests in the {OUTAGE:g} s outage (bound {bound})")
    assert len(during) <= bound, (len(during), bound)
    assert "delivery.deliver_batch" in log.read_text(errors="replace"), "no batch was sent"
