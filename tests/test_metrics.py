"""Prometheus metrics, alert rules and structured transition logs.

Unit tests feed the collectors directly; integration tests scrape ``delivery metrics`` on
PostgreSQL and Redis, and a prefork worker that sums its children's counters.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from delivery.cli import main
from delivery.config.loading import load_settings
from delivery.config.settings import BreakerConfig
from delivery.core.models import Message, utcnow
from delivery.core.status import FINAL
from delivery.guards.breaker import BreakerState, BreakerTransition, CircuitBreaker, Verdict
from delivery.guards.redis_client import redis_client
from delivery.observability.events import Transition, emit
from delivery.observability.metrics import OutboxCollector, WorkerMetrics, exporter_registry
from delivery.receipts import Receiver
from delivery.runtime import partitions
from delivery.runtime.db import make_engine, make_sessionmaker, upgrade
from delivery.testing.processes import ServiceProcess, worker
from delivery.testing.stub_provider import StubServer
from tests.conftest import REDIS_URL, RUN_DIR, free_port, own_database, wait_until
from tests.factories import add

ROOT = Path(__file__).resolve().parents[1]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Exposition text -> {(sample name, sorted labels): value}."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def total(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """Sum of ``name`` over every series whose labels include ``labels``."""
    return sum(
        v for (n, have), v in found.items() if n == name and set(labels.items()) <= set(have)
    )


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path}/m.sqlite3")
    upgrade(engine)
    yield engine
    engine.dispose()


# --- unit: the collectors -----------------------------------------------------------------


def test_outbox_collector_reads_counts_ages_and_breakers(sqlite_engine: Engine) -> None:
    """The outbox collector exports counts per provider and status, dead-letter depth, the
    oldest pending age, relay lag and breaker states, read at scrape time."""
    with make_sessionmaker(sqlite_engine)() as session:
        add(session, "d1", "dead")
        add(session, "d2", "dead", provider="twilio")
        add(
            session,
            "p1",
            "pending",
            created_at=utcnow() - dt.timedelta(minutes=10),
            next_attempt_at=utcnow() - dt.timedelta(seconds=30),
        )
        registry = exporter_registry(
            sqlite_engine, lambda: {"stub": ("open", 5), "twilio": ("closed", 0)}
        )

        first = samples(generate_latest(registry).decode())
        assert value(first, "delivery_outbox_up") == 1
        assert value(first, "delivery_messages", provider="stub", status="dead") == 1
        assert value(first, "delivery_messages", provider="stub", status="pending") == 1
        assert value(first, "delivery_dead_letter_messages", provider="twilio") == 1
        assert value(first, "delivery_oldest_pending_age_seconds") == pytest.approx(600, abs=10)
        assert value(first, "delivery_relay_lag_seconds") == pytest.approx(30, abs=10)
        assert value(first, "delivery_breaker_state", provider="stub") == 2
        assert value(first, "delivery_breaker_state", provider="twilio") == 0
        assert value(first, "delivery_breaker_failures", provider="stub") == 5
        assert not any(name == "delivery_partition_days_ahead" for name, _ in first)

        add(session, "d3", "dead")
        second = samples(generate_latest(registry).decode())
        assert value(second, "delivery_dead_letter_messages", provider="stub") == 2


@pytest.mark.integration
def test_the_exporter_says_how_many_days_a_partitioned_outbox_has_ready(
    pg_engine: Engine,
) -> None:
    """On a PostgreSQL outbox partitioned by day, ``delivery_partition_days_ahead`` is how many
    days after today can take messages: 7 as migrated (beat keeps them), fewer once the last
    days are gone, -1 when not even today can (``enqueue`` would fail)."""
    with own_database("metrics_days") as engine:
        upgrade(engine)

        def ahead() -> float:
            return value(
                samples(generate_latest(exporter_registry(engine)).decode()),
                "delivery_partition_days_ahead",
            )

        assert ahead() == 7
        with engine.connect() as conn:
            days = partitions.listing(conn)
        for gone, expected in ((days[-3:], 4), (days[:-3], -1)):
            with engine.begin() as conn:
                for day in gone:
                    suffix = day.suffix
                    conn.execute(
                        text(
                            f"DROP TABLE delivery_receipts_{suffix}, "
                            f"delivery_attempts_{suffix}, {day.name}"
                        )
                    )
            assert ahead() == expected


def test_outbox_collector_reports_down_instead_of_failing(tmp_path: Path) -> None:
    """A database the collector cannot read gives ``delivery_outbox_up 0``, not an error."""
    engine = make_engine(f"sqlite:///{tmp_path}/never-migrated.sqlite3")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OutboxCollector(engine))
    found = samples(generate_latest(registry).decode())
    assert value(found, "delivery_outbox_up") == 0
    engine.dispose()


def test_worker_metrics_count_attempts_transitions_latency_and_breakers() -> None:
    """Transitions feed attempts by outcome and provider, the send latency from the enqueue
    time on the sent transition, and breaker transitions; other transitions are not counted
    as attempts."""
    registry = CollectorRegistry()
    created = utcnow() - dt.timedelta(seconds=42)
    metrics = WorkerMetrics(registry)
    metrics.observe_transition(Transition(1, "k1", "stub", "dispatched", "sending", 1))
    metrics.observe_transition(
        Transition(1, "k1", "stub", "sending", "dispatched", 1, "retryable", "503", 0.2)
    )
    metrics.observe_transition(Transition(1, "k1", "stub", "dispatched", "sending", 2))
    metrics.observe_transition(
        Transition(1, "k1", "stub", "sending", "sent", 2, "delivered", enqueued_at=created)
    )
    metrics.observe_transition(Transition(2, "k2", "stub", "dead", "pending", 0, "redrive"))
    metrics.observe_breaker(BreakerTransition("stub", "half_open", "open", 3, utcnow(), "redis"))
    metrics.observe_relay(7)

    get = registry.get_sample_value
    assert get("delivery_attempts_total", {"provider": "stub", "outcome": "retryable"}) == 1
    assert get("delivery_attempts_total", {"provider": "stub", "outcome": "delivered"}) == 1
    assert get("delivery_attempts_total", {"provider": "stub", "outcome": "redrive"}) is None
    labels = {
        "provider": "stub",
        "from_status": "dead",
        "to_status": "pending",
        "outcome": "redrive",
    }
    assert get("delivery_transitions_total", labels) == 1
    assert get("delivery_send_latency_seconds_count", {"provider": "stub"}) == 1
    assert get("delivery_send_latency_seconds_sum", {"provider": "stub"}) == pytest.approx(
        42, abs=2
    )
    assert get("delivery_send_latency_seconds_bucket", {"provider": "stub", "le": "30.0"}) == 0
    assert get("delivery_send_latency_seconds_bucket", {"provider": "stub", "le": "60.0"}) == 1
    breaker = {"provider": "stub", "from_state": "half_open", "to_state": "open"}
    assert get("delivery_breaker_transitions_total", breaker) == 1
    assert get("delivery_relay_batch_size_sum") == 7


def test_beat_relay_pass_feeds_the_batch_size_histogram(clean: Engine) -> None:
    """Each relay pass that beat runs observes its batch size once (an empty pass too)."""
    from delivery.worker import metrics as worker_metrics
    from delivery.worker.schedule import relay_pass

    before = worker_metrics.registry.get_sample_value("delivery_relay_batch_size_count") or 0
    relay_pass()
    after = worker_metrics.registry.get_sample_value("delivery_relay_batch_size_count")
    assert after == before + 1


def test_beat_runs_the_relay_and_serves_its_metrics(clean: Engine, tmp_path: Path) -> None:
    """A beat process alone (no worker) runs relay passes in its own threads and serves their
    batch sizes on DELIVERY_BEAT_METRICS_PORT."""
    from delivery.testing.processes import beat
    from tests.conftest import free_port

    port = free_port()
    env = {**os.environ, "DELIVERY_BEAT_METRICS_PORT": str(port)}
    proc = beat(tmp_path / "beat.log", tmp_path / "schedule", env=env).start()
    try:

        def passes() -> float:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                return 0.0
            found = re.search(r"^delivery_relay_batch_size_count (\S+)$", page, re.M)
            return float(found.group(1)) if found else 0.0

        wait_until(lambda: passes() >= 3, 30)
    finally:
        proc.stop()
    assert "relay every" in proc.output()


# --- alert rules --------------------------------------------------------------------------


def exported_samples(engine: Engine) -> dict[str, set[str]]:
    """Every sample name we export -> its label names, with one observation of each kind."""
    registry = exporter_registry(engine, lambda: {"stub": ("open", 5)})
    worker_registry = CollectorRegistry()
    metrics = WorkerMetrics(worker_registry)
    metrics.observe_transition(
        Transition(1, "k", "stub", "sending", "sent", 1, "delivered", enqueued_at=utcnow())
    )
    metrics.observe_breaker(BreakerTransition("stub", "half_open", "open", 1, utcnow(), "redis"))
    metrics.observe_transition(
        Transition(
            2,
            "k2",
            "stub",
            "sending",
            "pending",
            1,
            "retryable",
            "unavailable",
            to_provider="backup",
            channel="sms",
        )
    )
    metrics.observe_relay(1)
    receiver = Receiver(engine, {})  # the receipt receiver's own counters
    receiver.stored.labels("stub", "delivered").inc()
    receiver.refused.labels("stub", "403").inc()
    names: dict[str, set[str]] = {}
    for reg in (registry, worker_registry, receiver.registry):
        for family in reg.collect():
            for sample in family.samples:
                names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_alert_rules_only_use_exported_metrics(sqlite_engine: Engine) -> None:
    """deploy/alerts.yml parses, has the five seed alerts and the failover one, and every
    expression names only metrics (and label names) that we export."""
    with make_sessionmaker(sqlite_engine)() as session:
        add(session, "x", "dead")
    exported = exported_samples(sqlite_engine)
    rules = yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text())["groups"][0]["rules"]
    names = {rule["alert"] for rule in rules}
    assert {
        "DeliveryDeadLettersGrowingWhileProviderHealthy",
        "DeliveryBreakerOpen",
        "DeliveryBreakerOpenTooLong",
        "DeliveryBreakerProbeFailing",
        "DeliveryOldestPendingTooOld",
    } <= names
    breaker_states = {state.value for state in BreakerState}
    for rule in rules:
        expr = rule["expr"]
        used = set(re.findall(r"\bdelivery_[a-z_]+", expr))
        assert used, rule["alert"]
        assert used <= set(exported), (rule["alert"], used - set(exported))
        for name, matchers in re.findall(r"(delivery_[a-z_]+)\s*\{([^}]*)\}", expr):
            for label, label_value in re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', matchers):
                assert label in exported[name], (rule["alert"], name, label)
                if label in ("from_state", "to_state"):
                    assert label_value in breaker_states, (rule["alert"], label_value)
        for label in re.findall(r"\bon\s*\(\s*(\w+)\s*\)", expr):
            assert any(label in exported[n] for n in used), (rule["alert"], label)
        assert rule["labels"]["severity"] and rule["annotations"]["summary"]
    assert "for" in next(r for r in rules if r["alert"] == "DeliveryBreakerOpenTooLong")
    too_long = next(r for r in rules if r["alert"] == "DeliveryBreakerOpenTooLong")
    assert too_long["for"] == "5m"
    # A channel on its backup for more than 10 minutes: failovers to it all that time.
    backup = next(r for r in rules if r["alert"] == "DeliveryOnBackupProvider")
    assert backup["for"] == "10m"
    assert re.search(r"by \(channel, to\) \(rate\(delivery_failovers_total\[", backup["expr"])
    assert {"channel", "from", "to", "reason"} <= exported["delivery_failovers_total"]


# --- structured logs ----------------------------------------------------------------------


def test_transition_log_line_is_json_without_recipient(caplog: pytest.LogCaptureFixture) -> None:
    """Each transition is one JSON log line with id, key, provider, from, to, attempt,
    outcome and code; the Transition carries no recipient at all."""
    assert "recipient" not in Transition.__dataclass_fields__
    with caplog.at_level(logging.INFO, logger="delivery.events"):
        emit(Transition(7, "order-7", "stub", "sending", "dead", 2, "permanent", "21211"))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "delivery.events"]
    assert json.loads(line) == {
        "event": "transition",
        "message_id": 7,
        "key": "order-7",
        "provider": "stub",
        "from_status": "sending",
        "to_status": "dead",
        "attempt": 2,
        "outcome": "permanent",
        "code": "21211",
    }


@pytest.mark.integration
def test_worker_logs_every_transition_as_json_with_no_recipient(live: Engine, stub: Any) -> None:
    """The real worker's log has one JSON line per transition of each message (from, to,
    attempt, outcome, provider), and neither recipient appears anywhere in it."""
    import delivery
    import delivery.worker

    # A breaker left open or half-open by an earlier test would park these messages.
    CircuitBreaker("stub", BreakerConfig(), client=redis_client(REDIS_URL)).reset()
    ok_to, bad_to = "+12015550177", "+12015550178"
    stub.set_faults(rules={bad_to: {"status": 400, "json": {"code": 21211, "message": "bad"}}})
    with Session(live) as session, session.begin():
        delivery.enqueue(session, channel="sms", to=ok_to, payload={"body": "b"}, key="log-ok")
        delivery.enqueue(session, channel="sms", to=bad_to, payload={"body": "b"}, key="log-bad")
    log_file = RUN_DIR / "worker.log"

    def events() -> list[dict[str, Any]]:
        found = []
        for line in log_file.read_text(errors="replace").splitlines():
            if '"event": "transition"' in line and '"key": "log-' in line:
                found.append(json.loads(line[line.index("{") :]))
        return found

    wait_until(lambda: {e["to_status"] for e in events()} >= {"sent", "dead"}, 30)
    chains = {
        key: [
            (e["from_status"], e["to_status"], e["attempt"], e.get("outcome"))
            for e in events()
            if e["key"] == key
        ]
        for key in ("log-ok", "log-bad")
    }
    assert chains == {
        "log-ok": [("dispatched", "sending", 1, None), ("sending", "sent", 1, "delivered")],
        "log-bad": [("dispatched", "sending", 1, None), ("sending", "dead", 1, "permanent")],
    }
    assert all(e["provider"] == "stub" and isinstance(e["message_id"], int) for e in events())
    text = log_file.read_text(errors="replace")
    for to in (ok_to, bad_to):
        assert to not in text and to[1:] not in text


# --- integration: the exporter on PostgreSQL and Redis ------------------------------------


@pytest.mark.integration
def test_metrics_command_reads_the_outbox_and_breakers_on_each_scrape(clean: Engine) -> None:
    """``delivery metrics --port 0`` serves counts, dead-letter depth, oldest pending age and
    the shared breaker state; a second scrape sees rows added after the first; ``watch``
    shows the open breaker too."""
    breaker = CircuitBreaker(
        "stub",
        BreakerConfig(failure_threshold=1, reset_timeout=120),
        client=redis_client(REDIS_URL),
    )
    breaker.reset()
    process: ServiceProcess | None = None
    try:
        with make_sessionmaker(clean)() as session:
            add(session, "m-dead-1", "dead")
            add(session, "m-dead-2", "dead")
            # Dispatched with a long lease: neither the relay nor the sweeper touch it.
            add(
                session,
                "m-open",
                "dispatched",
                created_at=utcnow() - dt.timedelta(minutes=20),
                lease_expires_at=utcnow() + dt.timedelta(hours=1),
                attempts=1,
            )
            breaker.record(breaker.allow(), Verdict.FAILURE)
            assert breaker.status().state == "open"

            argv = [sys.executable, "-m", "delivery.cli", "metrics", "--port", "0"]
            process = ServiceProcess(
                "metrics", argv, log=RUN_DIR / "metrics.log", ready="serving metrics on", cwd=ROOT
            ).start()
            port = re.findall(
                r"serving metrics on http://127.0.0.1:(\d+)/metrics", process.output()
            )[-1]
            url = f"http://127.0.0.1:{port}/metrics"

            first = samples(httpx.get(url, timeout=10).text)
            assert value(first, "delivery_outbox_up") == 1
            assert value(first, "delivery_dead_letter_messages", provider="stub") == 2
            assert value(first, "delivery_messages", provider="stub", status="dispatched") == 1
            assert value(first, "delivery_oldest_pending_age_seconds") == pytest.approx(
                1200, abs=30
            )
            assert value(first, "delivery_breaker_state", provider="stub") == 2

            add(session, "m-dead-3", "dead")
            second = samples(httpx.get(url, timeout=10).text)
            assert value(second, "delivery_dead_letter_messages", provider="stub") == 3

            frame = json.loads(CliRunner().invoke(main, ["watch", "--once", "--json"]).output)
            assert frame["breakers"] == {"stub": "open", "unguarded": "disabled"}
            assert frame["statuses"]["dead"] == 3
    finally:
        breaker.reset()
        if process is not None:
            process.stop()


# --- integration: a prefork worker sums its children --------------------------------------


@pytest.mark.integration
def test_prefork_worker_serves_counters_summed_over_its_children(tmp_path: Path) -> None:
    """A prefork worker with PROMETHEUS_MULTIPROC_DIR serves attempts and send latency summed
    over its child processes (embedded SQLite outbox and file broker, stub over HTTP)."""
    count, rejected = 30, "+12015550199"
    home, prom = tmp_path / "home", tmp_path / "prom"
    prom.mkdir()
    with StubServer().start() as stub:
        stub.set_faults(
            delay_ms=30, rules={rejected: {"status": 400, "json": {"code": 21211, "message": "x"}}}
        )
        config = tmp_path / "delivery.toml"
        config.write_text(
            f'[providers.stub]\nkind = "http"\nbase_url = "{stub.url}"\n'
            '[channels.sms]\nprovider = "stub"\non_unknown = "retry"\n'
        )
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DELIVERY_", "PROMETHEUS_"))
        }
        metrics_port = free_port()
        env.update(
            DELIVERY_HOME=str(home),
            DELIVERY_CONFIG=str(config),
            PROMETHEUS_MULTIPROC_DIR=str(prom),
            DELIVERY_METRICS_PORT=str(metrics_port),
        )
        engine = make_engine(load_settings(env).database_url)
        upgrade(engine)
        proc = worker(tmp_path / "worker.log", env=env, pool="prefork", concurrency=2).start()
        try:
            script = (
                "import delivery, tasks\n"
                "from sqlalchemy.orm import Session\n"
                "from delivery.runtime.db import make_engine\n"
                "engine = make_engine(delivery.get_settings().database_url)\n"
                "with Session(engine) as s, s.begin():\n"
                f"    for i in range({count - 1}):\n"
                "        delivery.enqueue(s, channel='sms', to=f'+1201555{i:04d}',"
                " payload={'body': 'x'}, key=f'mp-{i}')\n"
                f"    delivery.enqueue(s, channel='sms', to='{rejected}', payload={{'body': 'x'}},"
                " key='mp-rejected')\n"
            )
            subprocess.run(
                [sys.executable, "-c", script], env=env, cwd=ROOT, check=True, timeout=60
            )

            def final() -> int:
                with Session(engine) as session:
                    query = select(func.count()).where(Message.status.in_([s.value for s in FINAL]))
                    return int(session.scalar(query) or 0)

            wait_until(lambda: final() == count, 60)
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            wait_until(
                lambda: (
                    total(samples(httpx.get(url, timeout=5).text), "delivery_attempts_total")
                    == count
                ),
                10,
            )
            found = samples(httpx.get(url, timeout=5).text)
        finally:
            proc.stop(timeout=3)  # a prefork warm shutdown takes ~7 s; the data is in
            engine.dispose()
    delivered = {"provider": "stub", "outcome": "delivered"}
    assert total(found, "delivery_attempts_total", **delivered) == count - 1
    assert total(found, "delivery_attempts_total", outcome="permanent") == 1
    assert total(found, "delivery_send_latency_seconds_count", provider="stub") == count - 1
    assert total(found, "delivery_transitions_total", to_status="sending") == count
    writers = {p.stem.rsplit("_", 1)[-1] for p in prom.glob("counter_*.db")}
    assert len(writers) >= 2, f"only {writers} wrote counters: not a multi-process run"
