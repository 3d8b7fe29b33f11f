"""The circuit breaker: its state machine on real Redis (and its local twin), the config, the
CLI, the sender's parking, and two real worker processes through a provider outage.

The worker tests run on their own database, their own stub provider and this slot's
shared-state Redis db (as broker and breaker store), so that no other worker or relay of the
suite can take their messages.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.orm import Session

from delivery.cli import main
from delivery.config.loading import load_settings, settings_from_mapping
from delivery.config.settings import BreakerConfig, Settings
from delivery.errors import ConfigError
from delivery.guards.breaker import (
    HALF_OPEN_POLL,
    CircuitBreaker,
    add_breaker_hook,
    remove_breaker_hook,
)
from delivery.guards.redis_client import redis_client as make_client
from delivery.pipeline import outbox
from delivery.pipeline.models import Message
from delivery.pipeline.relay import claim
from delivery.pipeline.sender import CIRCUIT_OPEN, deliver
from delivery.runtime.db import make_engine, upgrade
from delivery.runtime.service import Service
from delivery.testing.processes import ServiceProcess, beat, stub_provider, worker
from delivery.testing.stub_provider import StubClient, StubServer
from tests.conftest import PG_SERVER, REDIS_URL, SLOT, drained, free_port, wait_until

# ---------------------------------------------------------------------------------------------
# The state machine, on both backends


class Backend:
    """Breakers for one fresh provider name: on Redis (each ``peer`` is another process's
    object with its own connection) or local (one object per process, so peers share it)."""

    def __init__(self, kind: str, redis_client: Any) -> None:
        self.kind, self.redis = kind, redis_client
        self.provider = f"unit-{uuid.uuid4().hex[:8]}"
        self.config = BreakerConfig()
        self.probe_ttl = 30.0
        self._local: CircuitBreaker | None = None

    def breaker(self, probe_ttl: float = 30.0, **config: Any) -> CircuitBreaker:
        self.config, self.probe_ttl = BreakerConfig(**config), probe_ttl
        return self.peer()

    def peer(self) -> CircuitBreaker:
        if self.kind == "local":
            if self._local is None:
                self._local = CircuitBreaker(self.provider, self.config, probe_ttl=self.probe_ttl)
            return self._local
        client = make_client(REDIS_URL)
        return CircuitBreaker(self.provider, self.config, client=client, probe_ttl=self.probe_ttl)

    def cleanup(self) -> None:
        if self.redis is not None:
            self.redis.delete(
                f"delivery:breaker:{{{self.provider}}}",
                f"delivery:breaker:{{{self.provider}}}:failures",
            )


@pytest.fixture(params=["redis", "local"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    client = request.getfixturevalue("redis_client") if request.param == "redis" else None
    made = Backend(request.param, client)
    yield made
    made.cleanup()


def opened(b: CircuitBreaker) -> None:
    permit = b.allow()
    for _ in range(b.config.failure_threshold):
        b.record(permit, "retryable")
    assert b.status().state == "open"


def test_transient_failures_open_it_at_the_threshold(backend: Backend) -> None:
    """Retryable and unknown outcomes count; the threshold-th opens it and callers are told
    to come back after reset_timeout."""
    b = backend.breaker(failure_threshold=3, reset_timeout=5)
    permit = b.allow()
    assert (permit.allowed, permit.state) == (True, "closed")
    b.record(permit, "retryable")
    b.record(permit, "unknown")
    assert b.allow().allowed
    before = time.time()
    b.record(permit, "lookup_failed")
    refused = b.allow()
    assert (refused.allowed, refused.state) == (False, "open")
    assert refused.retry_at is not None and before + 4.5 < refused.retry_at < time.time() + 5.5
    assert b.status().failures == 3


def test_permanent_outcomes_never_open_it(backend: Backend) -> None:
    """Ten 4xx-class (permanent) outcomes leave it closed with no failure counted."""
    b = backend.breaker(failure_threshold=2)
    permit = b.allow()
    for _ in range(10):
        b.record(permit, "permanent")
    status = b.status()
    assert (status.state, status.failures) == ("closed", 0)
    assert b.allow().allowed


def test_a_success_does_not_wipe_the_failure_window(backend: Backend) -> None:
    """Two failures, a success, one more failure: still three in the window, so it opens."""
    b = backend.breaker(failure_threshold=3)
    permit = b.allow()
    b.record(permit, "retryable")
    b.record(permit, "retryable")
    b.record(permit, "delivered")
    assert b.status().failures == 2
    b.record(permit, "retryable")
    assert b.status().state == "open"


def test_failures_older_than_the_window_do_not_count(backend: Backend) -> None:
    """Two failures age out of a 0.5 s window: a third later one leaves it closed."""
    b = backend.breaker(failure_threshold=3, window=0.5)
    permit = b.allow()
    b.record(permit, "retryable")
    b.record(permit, "retryable")
    time.sleep(0.6)
    b.record(permit, "retryable")
    status = b.status()
    assert (status.state, status.failures) == ("closed", 1)
    b.record(permit, "retryable")
    b.record(permit, "retryable")
    assert b.status().state == "open"


def test_a_failed_probe_reopens_it_for_another_reset_timeout(backend: Backend) -> None:
    """After reset_timeout one probe goes; its failure reopens the breaker for reset_timeout."""
    b = backend.breaker(failure_threshold=1, reset_timeout=0.3)
    opened(b)
    assert not b.allow().allowed
    time.sleep(0.35)
    probe = b.allow()
    assert (probe.allowed, probe.probe, probe.state) == (True, True, "half_open")
    b.record(probe, "unknown")
    refused = b.allow()
    assert (refused.allowed, refused.state) == (False, "open")
    assert refused.retry_at is not None and refused.retry_at > time.time() + 0.2


def test_success_threshold_probes_close_it_and_clear_the_window(backend: Backend) -> None:
    """Two probe successes close it; the old failures are forgotten; meanwhile a second
    caller is turned away and told to come back within HALF_OPEN_POLL."""
    b = backend.breaker(failure_threshold=2, reset_timeout=0.2, success_threshold=2)
    opened(b)
    time.sleep(0.25)
    first = b.allow()
    assert first.probe
    other = b.allow()
    assert (other.allowed, other.state) == (False, "half_open")
    assert other.retry_at is not None and other.retry_at <= time.time() + HALF_OPEN_POLL + 0.01
    b.record(first, "delivered")
    assert b.status().state == "half_open"
    second = b.allow()
    assert second.probe
    b.record(second, "found")
    status = b.status()
    assert (status.state, status.failures) == ("closed", 0)
    b.record(b.allow(), "retryable")
    assert b.status().state == "closed"


def test_a_dead_prober_does_not_wedge_half_open(backend: Backend) -> None:
    """A probe that never reports expires after probe_ttl; its late report decides nothing."""
    b = backend.breaker(failure_threshold=1, reset_timeout=0.1, probe_ttl=0.3)
    opened(b)
    time.sleep(0.15)
    lost = b.allow()
    assert lost.probe
    assert not b.allow().allowed
    time.sleep(0.35)
    fresh = b.allow()
    assert fresh.probe
    b.record(lost, "delivered")
    assert b.status().probe_in_flight
    b.record(fresh, "retryable")
    assert b.status().state == "open"


def test_a_permanent_probe_outcome_frees_the_probe(backend: Backend) -> None:
    """A probe answered 4xx neither closes nor reopens it: the next caller may probe."""
    b = backend.breaker(failure_threshold=1, reset_timeout=0.1)
    opened(b)
    time.sleep(0.15)
    probe = b.allow()
    b.record(probe, "permanent")
    status = b.status()
    assert (status.state, status.probe_in_flight) == ("half_open", False)
    assert b.allow().probe


def test_concurrent_half_open_callers_get_exactly_one_probe(backend: Backend) -> None:
    """Twenty threads (each with its own breaker object and connection on Redis) ask at the
    same moment: exactly one gets the probe."""
    b = backend.breaker(failure_threshold=1, reset_timeout=0.2)
    opened(b)
    peers = [backend.peer() for _ in range(20)]
    for peer in peers:
        peer.status()  # connect now, so that the calls below race
    time.sleep(0.25)
    gate = threading.Barrier(len(peers))
    permits: list[Any] = []

    def ask(peer: CircuitBreaker) -> None:
        gate.wait()
        permits.append(peer.allow())

    threads = [threading.Thread(target=ask, args=(peer,)) for peer in peers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(permits) == 20
    assert sum(p.allowed for p in permits) == 1
    assert sum(p.probe for p in permits) == 1
    assert {p.source for p in permits} == {backend.kind}


def test_transitions_are_logged_as_json_and_passed_to_hooks(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """closed -> open -> half_open -> closed: three JSON log lines and three hook calls; a
    failing hook is isolated."""
    seen: list[Any] = []

    def broken(_: Any) -> None:
        raise RuntimeError("hook bug")

    add_breaker_hook(broken)
    add_breaker_hook(seen.append)
    caplog.set_level(logging.INFO, logger="delivery.breaker")
    try:
        b = backend.breaker(failure_threshold=2, reset_timeout=0.1, success_threshold=1)
        opened(b)
        time.sleep(0.15)
        b.record(b.allow(), "delivered")
    finally:
        remove_breaker_hook(broken)
        remove_breaker_hook(seen.append)
    steps = [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert [(t.from_state, t.to_state) for t in seen] == steps
    assert {t.provider for t in seen} == {backend.provider}
    assert (seen[0].failures, seen[0].source) == (2, backend.kind)
    lines = [r.getMessage() for r in caplog.records if r.name == "delivery.breaker"]
    events = [json.loads(line) for line in lines if line.startswith('{"event": "breaker_trans')]
    assert [(e["from"], e["to"]) for e in events] == steps
    assert events[0]["provider"] == backend.provider and events[0]["failures"] == 2
    assert events[0]["at"].endswith("+00:00")


# ---------------------------------------------------------------------------------------------
# Redis unreachable


def test_unreachable_redis_falls_back_to_a_local_breaker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With Redis at 127.0.0.1:1 the same rules apply in-process, with one warning, no raise."""
    caplog.set_level(logging.INFO, logger="delivery.breaker")
    b = CircuitBreaker(
        "down", BreakerConfig(failure_threshold=2), client=make_client("redis://127.0.0.1:1/0")
    )
    permit = b.allow()
    assert (permit.allowed, permit.source) == (True, "local")
    b.record(permit, "retryable")
    b.record(permit, "retryable")
    refused = b.allow()
    assert (refused.allowed, refused.state, refused.source) == (False, "open", "local")
    warnings = [r for r in caplog.records if "breaker_redis_error" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_unreachable_redis_with_allow_sends_without_a_breaker() -> None:
    """on_redis_error = "allow": every call is allowed while Redis is unreachable."""
    config = BreakerConfig(failure_threshold=1, on_redis_error="allow")
    b = CircuitBreaker("down", config, client=make_client("redis://127.0.0.1:1/0"))
    for _ in range(5):
        permit = b.allow()
        assert (permit.allowed, permit.source) == (True, "none")
        b.record(permit, "retryable")


# ---------------------------------------------------------------------------------------------
# Config and CLI


def _settings(breaker: dict[str, Any] | None) -> Settings:
    provider: dict[str, Any] = {"kind": "http", "base_url": "http://127.0.0.1:9"}
    if breaker is not None:
        provider["breaker"] = breaker
    return settings_from_mapping(
        {"providers": {"p": provider}},
        database_url="sqlite://",
        broker_url="memory://",
        redis_url=None,
    )


def test_breaker_config_defaults_and_overrides() -> None:
    """Seed 001's defaults apply per provider; [providers.p.breaker] overrides them."""
    assert _settings(None).providers["p"].breaker == BreakerConfig(5, 60.0, 30.0, 2, "local")
    custom = _settings({"failure_threshold": 3, "window": 10, "on_redis_error": "allow"})
    assert custom.providers["p"].breaker == BreakerConfig(3, 10.0, 30.0, 2, "allow")


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"threshold": 3}, "providers.p.breaker.threshold"),
        ({"failure_threshold": 0}, "providers.p.breaker.failure_threshold"),
        ({"window": "60s"}, "providers.p.breaker.window"),
        ({"on_redis_error": "crash"}, "providers.p.breaker.on_redis_error"),
    ],
)
def test_bad_breaker_config_names_the_key(table: dict[str, Any], key: str) -> None:
    """An unknown or invalid breaker key fails with its dotted name."""
    with pytest.raises(ConfigError) as caught:
        _settings(table)
    assert caught.value.key == key


def test_cli_breaker_status_and_reset(redis_client: Any, pg_engine: Any, tmp_path: Path) -> None:
    """`breaker status --json` shows an open breaker with its next probe time; `breaker
    reset` closes it and writes an audit row (cli:$USER); an unknown provider exits 2 naming
    it."""
    name = f"cli{uuid.uuid4().hex[:6]}"
    config = tmp_path / "cli.toml"
    config.write_text(
        f'[providers.{name}]\nkind = "http"\nbase_url = "http://127.0.0.1:9"\n'
        f"[providers.{name}.breaker]\nfailure_threshold = 1\nreset_timeout = 60\n"
    )
    env = {"DELIVERY_CONFIG": str(config), "DELIVERY_REDIS_URL": REDIS_URL}
    b = CircuitBreaker(
        name, BreakerConfig(failure_threshold=1, reset_timeout=60), client=make_client(REDIS_URL)
    )
    try:
        b.record(b.allow(), "retryable")
        runner = CliRunner()
        result = runner.invoke(main, ["breaker", "status", "--json"], env=env)
        assert result.exit_code == 0, result.output
        (row,) = json.loads(result.output)
        assert (row["provider"], row["state"], row["failures"]) == (name, "open", 1)
        assert row["next_probe_at"] is not None
        table = runner.invoke(main, ["breaker", "status"], env=env)
        assert table.exit_code == 0 and "open" in table.output
        reset = runner.invoke(main, ["breaker", "reset", name], env=env)
        assert reset.exit_code == 0 and f"breaker {name}: open -> closed" in reset.output
        assert b.status().state == "closed"
        with pg_engine.connect() as conn:
            audited = conn.exec_driver_sql(
                "SELECT actor, detail FROM delivery_audit WHERE action = 'breaker_reset' "
                "ORDER BY id DESC LIMIT 1"
            ).one()
        assert audited[0].startswith("cli:") and f"breaker {name}: open -> closed" in audited[1]
        unknown = runner.invoke(main, ["breaker", "reset", "nope"], env=env)
        assert unknown.exit_code == 2 and "'nope' is not a configured provider" in unknown.output
        no_redis = runner.invoke(main, ["breaker", "status"], env={**env, "DELIVERY_REDIS_URL": ""})
        assert no_redis.exit_code == 2 and "DELIVERY_REDIS_URL" in no_redis.output
    finally:
        b.reset()


# ---------------------------------------------------------------------------------------------
# The sender, in process


def test_sender_parks_without_an_attempt_on_the_local_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis unreachable: deliver() uses the local breaker; once a 503 opens it, the next
    message goes back to pending with CIRCUIT_OPEN, no attempt spent and no request made."""
    monkeypatch.setattr(outbox, "_nudge", None)
    with StubServer().start() as stub:
        provider = {"kind": "http", "base_url": stub.url}
        provider["breaker"] = {"failure_threshold": 1, "reset_timeout": 30}  # type: ignore[assignment]
        settings = settings_from_mapping(
            {"providers": {"p": provider}, "channels": {"sms": {"provider": "p"}}},
            database_url=f"sqlite:///{tmp_path}/outbox.sqlite3",
            broker_url="memory://",
            redis_url="redis://127.0.0.1:1/0",
        )
        service = Service.from_settings(settings)
        try:
            upgrade(service.engine)
            stub.set_faults(error_rate=1.0)
            with Session(service.engine) as session, session.begin():
                for i in range(2):
                    outbox.enqueue(
                        session,
                        channel="sms",
                        to=f"+1201555010{i}",
                        payload={"body": "x"},
                        key=f"local-{i}",
                        settings=settings,
                    )
            with service.engine.begin() as conn:
                first, second = sorted(claim(conn, limit=10, lease=60))
            assert deliver(service, first.id, first.key).code == "HTTP_503"
            parked = deliver(service, second.id, second.key)
            assert (parked.action, parked.status, parked.code) == (
                "parked",
                "pending",
                CIRCUIT_OPEN,
            )
            assert parked.delay is not None and 29 < parked.delay < 31.5
            with Session(service.engine) as session:
                row = session.get_one(Message, second.id)
                assert (row.status, row.attempts, row.last_error_code) == (
                    "pending",
                    0,
                    CIRCUIT_OPEN,
                )
            assert len(stub.requests()) == 1
        finally:
            service.close()


# ---------------------------------------------------------------------------------------------
# Two real worker processes through a provider outage

THRESHOLD = 3
RESET = 2.0
CONCURRENCY = 4  # per worker; two workers
OUTAGE = 20.0
GRACE = 1.0  # requests allowed before the breaker opened reach the stub within this

RIG_TOML = """
[delivery]
relay_interval = 0.2
sweep_interval = 0.5
dispatch_lease = 10
send_lease = 8
max_attempts = 8

[backoff]
base = 0.05
cap = 0.5

[timeouts]
connect = 1
write = 1
read = 3
pool = 1

[providers.flaky]
kind = "http"
base_url = "http://127.0.0.1:{port}"

[providers.flaky.breaker]
failure_threshold = {threshold}
window = 10
reset_timeout = {reset}
success_threshold = 2

[channels.sms]
provider = "flaky"
"""


@dataclass
class Rig:
    engine: Engine
    stub: StubClient
    settings: Settings
    logs: list[Path]

    def breaker(self) -> CircuitBreaker:
        return CircuitBreaker(
            "flaky", self.settings.providers["flaky"].breaker, client=make_client(REDIS_URL)
        )


@pytest.fixture(scope="module")
def rig(
    pg_engine: Engine, redis_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    """Own database and stub; two workers (prefork and threads, 4 each) and beat, using this
    slot's shared-state Redis db as broker and breaker store."""
    run = tmp_path_factory.mktemp("breaker")
    db = f"delivery_test{SLOT or ''}_breaker"
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {db}"))
    engine = make_engine(f"{PG_SERVER}/{db}")
    upgrade(engine)
    port = free_port()
    config = run / "breaker.toml"
    config.write_text(RIG_TOML.format(port=port, threshold=THRESHOLD, reset=RESET))
    env = {
        **os.environ,
        "DELIVERY_DATABASE_URL": f"{PG_SERVER}/{db}",
        "DELIVERY_BROKER_URL": REDIS_URL,
        "DELIVERY_REDIS_URL": REDIS_URL,
        "DELIVERY_CONFIG": str(config),
        "DELIVERY_HOME": str(run / "home"),
    }
    redis_client.flushdb()
    logs = [run / "worker1.log", run / "worker2.log"]
    procs: list[ServiceProcess] = []
    try:
        procs.append(stub_provider(run / "stub.log", port).start())
        for log, pool in zip(logs, ("prefork", "threads"), strict=True):
            name = f"breaker-{pool}"
            procs.append(
                worker(log, env=env, pool=pool, concurrency=CONCURRENCY, name=name).start()
            )
        procs.append(beat(run / "beat.log", run / "beat-schedule", env=env).start())
        with StubClient(f"http://127.0.0.1:{port}") as stub:
            yield Rig(engine, stub, load_settings(env), logs)
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis_client.flushdb()
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture
def fresh(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> Rig:
    """An empty outbox, a stub with no faults, a closed breaker; no post-commit nudge (it
    would publish to the suite's broker, not the rig's)."""
    monkeypatch.setattr(outbox, "_nudge", None)
    with rig.engine.begin() as conn:
        conn.execute(text("TRUNCATE delivery_attempts, delivery_messages"))
    rig.stub.reset()
    rig.breaker().reset()
    return rig


def enqueue_many(rig: Rig, n: int, prefix: str, to: str | None = None) -> None:
    with Session(rig.engine) as session, session.begin():
        for i in range(n):
            outbox.enqueue(
                session,
                channel="sms",
                to=to or f"+1201555{i:04d}",
                payload={"body": f"code {i}"},
                key=f"{prefix}-{i}",
                settings=rig.settings,
            )


def worker_events(rig: Rig, since: float) -> list[dict[str, Any]]:
    """The JSON transition lines (breaker and message) the workers logged since ``since``."""
    events = []
    for log in rig.logs:
        for line in log.read_text(errors="replace").splitlines():
            start = line.find('{"event": ')
            if start >= 0:
                event = json.loads(line[start:])
                if event["event"] != "breaker_transition" or _at(event) >= since:
                    events.append(event)
    return events


def _at(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["at"]).timestamp()


def parked(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.scalar(
                text(
                    "SELECT count(*) FROM delivery_messages "
                    "WHERE status = 'pending' AND last_error_code = :code"
                ),
                {"code": CIRCUIT_OPEN},
            )
        )


@pytest.mark.integration
def test_outage_sends_one_probe_per_reset_timeout_and_spends_no_attempts(fresh: Rig) -> None:
    """A 20 s run of 503s with two workers (8 slots): once the breaker opens the provider sees
    at most one request per reset_timeout, messages are parked instead of spending attempts,
    and all 40 are sent after recovery."""
    rig = fresh
    started = time.time()
    rig.stub.set_faults(error_rate=1.0, error_status=503)
    enqueue_many(rig, 40, "outage")
    wait_until(lambda: parked(rig.engine) > 0, timeout=15)
    time.sleep(max(0.0, started + OUTAGE - time.time()))
    rig.stub.set_faults(error_rate=0.0)
    recovered = time.time()
    assert drained(rig.engine, 40, timeout=60) == {"sent": 40}

    requests = rig.stub.requests()
    events = worker_events(rig, started)
    breaker = sorted((e for e in events if e["event"] == "breaker_transition"), key=_at)
    opened_at = min(_at(e) for e in breaker if (e["from"], e["to"]) == ("closed", "open"))
    errors = sorted(r["at"] for r in requests if r["status"] == 503)
    before = [t for t in errors if t < opened_at + GRACE]
    during = [t for t in errors if t >= opened_at + GRACE]
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(during)]
    assert len(before) <= THRESHOLD + 2 * CONCURRENCY, before
    assert len(during) >= 4, "the breaker never probed again and again"
    assert min(gaps) >= RESET - 0.05, gaps
    assert len(during) <= (recovered - opened_at) / RESET + 1, gaps
    assert (breaker[-1]["from"], breaker[-1]["to"]) == ("half_open", "closed")

    with Session(rig.engine) as session:
        attempts = session.scalars(select(Message.attempts)).all()
    parks = [e for e in events if e.get("code") == CIRCUIT_OPEN and e["event"] == "transition"]
    assert sum(attempts) == len(requests), "an attempt was spent without a request"
    assert max(attempts) <= 6, sorted(attempts)
    assert len(parks) >= 40, len(parks)
    print(
        f"\n{len(before)} requests before open, {len(during)} probes in "
        f"{recovered - opened_at:.1f} s open, gaps {gaps}, {len(parks)} parks, "
        f"attempts max {max(attempts)} total {sum(attempts)}"
    )


@pytest.mark.integration
def test_4xx_answers_do_not_open_it(fresh: Rig) -> None:
    """Twenty 400s leave the shared breaker closed with nothing counted; the next message
    goes straight out."""
    rig = fresh
    rig.stub.set_faults(rules={"+12015550199": {"status": 400, "json": {"code": 21211}}})
    enqueue_many(rig, 20, "bad", to="+12015550199")
    assert drained(rig.engine, 20, timeout=30) == {"dead": 20}
    status = rig.breaker().status()
    assert (status.state, status.failures) == ("closed", 0)
    enqueue_many(rig, 1, "good")
    assert drained(rig.engine, 21, timeout=30) == {"dead": 20, "sent": 1}
