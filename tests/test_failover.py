"""Failover (issue 27; docs/concepts.md, "Failover") on a database of its own: each trigger of
the rule (``delivery.guards.failover``) through the real sender, the provider it skips, the
event and metric it leaves, and where a redrive sends a message. Only the providers are
stand-ins (``tests.fence_kit.ProviderStub``, in memory, counting effects).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import delivery
from delivery.core import outcomes
from delivery.core.models import Attempt, messages_table, utcnow
from delivery.guards.breaker import Breakers
from delivery.guards.breaker_machine import Verdict
from delivery.observability.events import Transition, add_hook, remove_hook
from delivery.observability.metrics import WorkerMetrics
from delivery.ops.repair import redrive
from delivery.relay.claims import relay_once
from delivery.runtime.service import Service
from delivery.sending.sender import deliver
from delivery.transitions import Action
from tests.conftest import REDIS_URL
from tests.fence_kit import (
    ProviderStub,
    add_row,
    fence_db,
    fence_engine,
    service_on,
    two_providers,
)

__all__ = ["fence_db", "fence_engine"]  # the fixtures, used by name

pytestmark = pytest.mark.integration

HOUR_AGO = dt.timedelta(hours=1)


class Rig:
    def __init__(self, engine: Engine, failover_after: float = 120.0) -> None:
        self.engine = engine
        self.stub, self.backup = ProviderStub(), ProviderStub(name="backup")
        self.service: Service = two_providers(
            service_on(engine, self.stub), self.backup, failover_after=failover_after
        )
        self.seen: list[Transition] = []

    def message(self, key: str, *, age: dt.timedelta = HOUR_AGO, **fields: Any) -> int:
        """A ``dispatched`` message enqueued ``age`` ago, due now, as the relay left it."""
        now = utcnow()
        lease = now + dt.timedelta(seconds=30)
        values = dict(created_at=now - age, lease_expires_at=lease, **fields)
        return add_row(self.engine, key, "dispatched", **values)

    def row(self, key: str) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(select(messages_table).where(messages_table.c.key == key)).one()

    def send(self, message_id: int, key: str) -> Any:
        return deliver(self.service, message_id, key)

    def relay_and_send(self) -> None:
        tasks: list[Any] = []
        relay_once(self.engine, tasks.extend, batch=50, lease=30)
        for task in tasks:
            self.send(task.id, task.key)

    def open_breaker(self, name: str) -> None:
        breaker = self.service.breaker(name)
        for _ in range(breaker.config.consecutive_failures):
            breaker.record(breaker.allow(), Verdict.FAILURE)
        assert breaker.status().state == "open"


@pytest.fixture
def rig(fence_db: Engine) -> Iterator[Rig]:
    rig = Rig(fence_db)
    add_hook(rig.seen.append)
    yield rig
    remove_hook(rig.seen.append)
    rig.service.close()


def test_an_open_breaker_sends_its_messages_to_the_backup(rig: Rig) -> None:
    """The primary's breaker refuses (an outage: no request made): the message moves to the
    backup at once, however recently it was enqueued, due now, without spending an attempt,
    and is sent there (same key); a pinned one waits for the primary's next probe."""
    rig.open_breaker("stub")
    new = rig.message("k-new", age=dt.timedelta(0))
    pinned = rig.message("k-pinned", pinned=True)
    moved = rig.send(new, "k-new")
    assert (moved.action, moved.code, moved.provider) == (Action.PARKED, "FAILOVER", "backup")
    row = rig.row("k-new")
    assert (row.provider, row.status, row.attempts, row.pinned) == ("backup", "pending", 0, False)
    waits = rig.send(pinned, "k-pinned")
    assert (waits.code, rig.row("k-pinned").provider) == ("CIRCUIT_OPEN", "stub")
    rig.relay_and_send()
    assert rig.row("k-new").status == "sent"
    assert (dict(rig.stub.effects), dict(rig.backup.effects)) == ({}, {"k-new": 1})
    (failover,) = [t for t in rig.seen if t.to_provider is not None]
    assert (failover.provider, failover.to_provider, failover.code) == (
        "stub",
        "backup",
        "circuit_open",
    )
    assert failover.channel == "sms" and failover.outcome is None  # no call was made


def test_a_backup_whose_breaker_is_open_is_skipped(rig: Rig) -> None:
    """Both breakers open: the message stays on the primary, parked until its next probe."""
    rig.open_breaker("stub")
    rig.open_breaker("backup")
    waits = rig.send(rig.message("k-1"), "k-1")
    assert (waits.code, rig.row("k-1").provider) == ("CIRCUIT_OPEN", "stub")


def test_a_call_that_created_nothing_fails_over_one_that_may_have_acted_pins(rig: Rig) -> None:
    """A 503 (refused before acting) on a message that waited too long: it moves on, its
    attempt counted (``delivery_failovers_total{reason="unavailable"}``). A 500 (the provider
    may have acted): it stays, ``pinned``, and waits for the primary."""
    metrics = WorkerMetrics(CollectorRegistry())
    add_hook(metrics.observe_transition)
    try:
        refused = outcomes.Retryable("HTTP_503", "down", 503, created_nothing=True)
        acted = outcomes.Retryable("HTTP_500", "failed while acting", 500)
        rig.stub.answers = [refused, acted]
        rig.send(rig.message("k-503"), "k-503")
        rig.send(rig.message("k-500"), "k-500")
    finally:
        remove_hook(metrics.observe_transition)
    moved, stayed = rig.row("k-503"), rig.row("k-500")
    assert (moved.provider, moved.attempts, moved.pinned) == ("backup", 1, False)
    assert (stayed.provider, stayed.pinned, stayed.last_error_code) == ("stub", True, "HTTP_500")
    labels = {"channel": "sms", "from": "stub", "to": "backup", "reason": "unavailable"}
    assert metrics.failovers.labels(**labels)._value.get() == 1
    with Session(rig.engine) as session:
        attempts = session.scalars(select(Attempt).order_by(Attempt.id)).all()
        assert [(a.provider, a.outcome) for a in attempts] == [
            ("stub", "retryable"),
            ("stub", "retryable"),
        ]
    rig.relay_and_send()
    assert dict(rig.backup.effects) == {"k-503": 1}


def test_a_long_rate_limit_wait_fails_over(rig: Rig) -> None:
    """The primary's rate limit would make the second message wait ~1000 s: it moves on."""
    stub = replace(rig.service.settings.providers["stub"], rate_limit=0.001)
    providers = {**rig.service.settings.providers, "stub": stub}
    rig.service.settings = rig.service.settings.with_(providers=providers)
    first, second = rig.message("k-a"), rig.message("k-b")
    assert rig.send(first, "k-a").status == "sent"
    assert rig.send(second, "k-b").code == "FAILOVER"
    assert [t.code for t in rig.seen if t.to_provider] == ["rate_limited"]


def test_never_and_a_channel_of_one_provider_stay(fence_db: Engine) -> None:
    """``failover_after = "never"`` (``math.inf``), and a channel whose route is one provider
    (``email`` here), never move, however long the message waited."""
    rig = Rig(fence_db, failover_after=float("inf"))
    try:
        rig.open_breaker("stub")
        assert rig.send(rig.message("k-never"), "k-never").code == "CIRCUIT_OPEN"
    finally:
        rig.service.close()
    rig = Rig(fence_db)
    try:
        rig.open_breaker("stub")
        email = rig.message("k-email", channel="email", recipient="ann@example.com")
        assert rig.send(email, "k-email").code == "CIRCUIT_OPEN"
        assert rig.row("k-email").provider == "stub"
    finally:
        rig.service.close()


def test_a_redrive_goes_to_the_first_provider_whose_breaker_is_closed(fence_db: Engine) -> None:
    """A ``dead`` message that is not pinned is redriven through the first provider of its
    route whose breaker is closed (shared through Redis); a pinned one keeps its provider."""
    base = delivery.get_settings()
    primary = replace(base.providers["stub"], name="fo-primary")
    backup = replace(primary, name="fo-backup")
    route = ("fo-primary", "fo-backup")
    sms = replace(base.channels["sms"], provider="fo-primary", providers=route)
    settings = base.with_(
        redis_url=REDIS_URL,
        providers={**base.providers, "fo-primary": primary, "fo-backup": backup},
        channels={**base.channels, "sms": sms},
    )
    breakers = Breakers(settings)
    breaker = breakers.get("fo-primary")
    delivery.configure(settings)
    try:
        for _ in range(primary.breaker.consecutive_failures):
            breaker.record(breaker.allow(), Verdict.FAILURE)
        assert breaker.status().state == "open"
        add_row(fence_db, "k-free", "dead", provider="fo-primary")
        add_row(fence_db, "k-pinned", "dead", provider="fo-primary", pinned=True)
        with Session(fence_db) as session:
            results = redrive(session, ["k-free", "k-pinned"])
            session.commit()
        assert all(r.redriven for r in results)
        with fence_db.connect() as conn:
            rows = dict(conn.execute(select(messages_table.c.key, messages_table.c.provider)).all())
        assert rows == {"k-free": "fo-backup", "k-pinned": "fo-primary"}
    finally:
        breaker.reset()
        breakers.close()
        delivery.configure(None)
