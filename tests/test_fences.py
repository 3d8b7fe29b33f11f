"""Fences and operations that must not misfire (issue 12, section 6), on real PostgreSQL.

Every part of ``delivery`` runs for real (relay claim, sender, sweeper, ops repairs); only the
provider is an in-memory stub without dedupe (``tests.fence_kit.ProviderStub``).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core import outcomes
from delivery.core.models import attempts_table, messages_table, utcnow
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError
from delivery.ops.repair import redrive
from delivery.providers.pigeon import SMTP_BUDGET, PigeonProvider
from delivery.providers.secrets import check_secrets
from delivery.relay.claims import relay_once
from delivery.relay.sweeper import sweep
from delivery.sending.attempt import PROVIDER_NOT_CONFIGURED
from delivery.sending.sender import deliver
from delivery.sending.settle import after_send
from delivery.transitions import Action, Result, Sending
from tests.fence_kit import ProviderStub, add_row, fence_db, fence_engine, service_on

__all__ = ["fence_db", "fence_engine"]  # fixtures, used by name

pytestmark = pytest.mark.integration


def row(engine: Engine, message_id: int) -> dict[str, object]:
    with engine.connect() as conn:
        found = conn.execute(select(messages_table).where(messages_table.c.id == message_id))
        return dict(found.one()._mapping)


def attempt_numbers(engine: Engine, message_id: int) -> list[tuple[int, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(attempts_table.c.number, attempts_table.c.kind, attempts_table.c.outcome)
            .where(attempts_table.c.message_id == message_id)
            .order_by(attempts_table.c.id)
        )
        return [(n, k, o) for n, k, o in rows]


def relay(engine: Engine) -> list[int]:
    claimed: list[int] = []
    relay_once(engine, lambda claims: claimed.extend(c.id for c in claims), batch=100, lease=60)
    return claimed


def do_redrive(engine: Engine, key: str) -> None:
    with Session(engine) as session:
        [result] = redrive(session, [key])
        assert result.redriven, result.reason
        session.commit()


def expire_lease(engine: Engine, message_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(messages_table)
            .where(messages_table.c.id == message_id)
            .values(lease_expires_at=utcnow() - dt.timedelta(seconds=1))
        )


def test_redrive_of_unknown_without_lookup_sends_again_with_the_same_key(
    fence_db: Engine,
) -> None:
    """An ``unknown`` message on a provider without lookup, once redriven, is sent again with
    its key (no NO_LOOKUP loop, nothing counted against the breaker) and ends sent."""
    provider = ProviderStub(supports_lookup=False)
    service = service_on(fence_db, provider)
    mid = add_row(fence_db, "nolookup-1", "unknown", attempts=1, on_unknown="give_up")
    do_redrive(fence_db, "nolookup-1")
    assert row(fence_db, mid)["needs_lookup"] is True
    assert relay(fence_db) == [mid]
    result = deliver(service, mid, "nolookup-1")
    assert (result.action, result.status) == (Action.DONE, "sent")
    assert provider.looked_up == [] and provider.sends == ["nolookup-1"]
    assert [(n, k) for n, k, _ in attempt_numbers(fence_db, mid)] == [(2, "send")]


def test_redrive_keeps_the_fence_so_a_late_worker_of_an_earlier_life_changes_nothing(
    fence_db: Engine,
) -> None:
    """After a redrive the attempt count goes on (never reset) and the budget is fresh: the
    late answer of a worker from the message's earlier life cannot settle the row a new
    worker is sending, and the attempt log numbers attempts across lives."""
    provider = ProviderStub()
    service = service_on(fence_db, provider)
    mid = add_row(fence_db, "life-1", "dispatched", on_unknown="give_up", max_attempts=2)
    backoff = service.settings.backoff
    worker_a = Sending(mid, "life-1", "stub", 1, 2, UnknownPolicy.GIVE_UP, backoff, utcnow())
    late: list[Result] = []

    def a_stalls(_: object) -> None:
        # Worker A (attempt 1) hangs; its lease expires, the sweeper parks the message
        # unknown (give_up) and ops redrive it; worker B takes it in its second life.
        expire_lease(fence_db, mid)
        assert sweep(fence_db).unknown == 1
        do_redrive(fence_db, "life-1")
        assert relay(fence_db) == [mid]
        provider.on_send = a_answers_late
        assert deliver(service, mid, "life-1").status == "sent"

    def a_answers_late(_: object) -> None:
        # While B is sending, A's answer finally arrives and is settled.
        late.append(after_send(service, worker_a, outcomes.Delivered("ref-A", 201), 0.0))

    provider.on_send = a_stalls
    first = deliver(service, mid, "life-1")
    assert late and late[0].action is Action.SKIP, late
    assert first.action is Action.SKIP, first
    final = row(fence_db, mid)
    assert final["status"] == "sent" and final["provider_ref"] == "ref-life-1-1"
    assert (final["attempts"], final["max_attempts"], final["budget_start"]) == (2, 3, 1)
    sends = [n for n, kind, outcome in attempt_numbers(fence_db, mid) if outcome == "delivered"]
    # B's attempt is number 2, not a second number 1. The two answers for attempt 1 (A's
    # own, and the late one) settle nothing, but both are logged: on PostgreSQL by the same
    # statement as the fenced UPDATE that found the row moved.
    assert sorted(sends) == [1, 1, 2]


def test_redrive_grants_the_enqueued_budget_again(fence_db: Engine) -> None:
    """A message dead after its attempts were spent gets as many attempts again per redrive,
    however often it is redriven; the fence never goes back."""
    mid = add_row(fence_db, "budget-1", "dead", attempts=3, max_attempts=3)
    for life in (1, 2):
        do_redrive(fence_db, "budget-1")
        got = row(fence_db, mid)
        assert (got["attempts"], got["max_attempts"]) == (3 * life, 3 * life + 3)
        with fence_db.begin() as conn:  # the new life spends its budget
            conn.execute(
                update(messages_table)
                .where(messages_table.c.id == mid)
                .values(status="dead", attempts=3 * life + 3)
            )


def test_lookup_that_outlives_the_lease_does_not_send(fence_db: Engine) -> None:
    """A lookup answering "absent" after the worker lost the row (lease expired, recovered,
    taken and sent by another worker) sends nothing: ownership is re-checked first."""
    provider = ProviderStub()
    service = service_on(fence_db, provider)
    mid = add_row(fence_db, "slow-lookup", "dispatched", on_unknown="lookup", needs_lookup=True)
    other: list[Result] = []

    def lease_lost(_: object) -> None:
        expire_lease(fence_db, mid)
        assert sweep(fence_db).recovered == 1
        assert relay(fence_db) == [mid]
        other.append(deliver(service, mid, "slow-lookup"))  # B: looks up, absent, sends

    provider.on_lookup = lease_lost
    result = deliver(service, mid, "slow-lookup")  # A: its lookup answers absent, too late
    assert other and other[0].status == "sent"
    assert result.action is Action.SKIP
    assert provider.effects["slow-lookup"] == 1
    assert row(fence_db, mid)["status"] == "sent"


def test_lookup_then_send_renews_the_lease(fence_db: Engine) -> None:
    """After a lookup answers absent the row's lease is renewed (on the database's clock)
    before the send, so a slow lookup does not eat the send's time."""
    provider = ProviderStub()
    service = service_on(fence_db, provider, send_lease=600)
    mid = add_row(fence_db, "renew", "dispatched", on_unknown="lookup", needs_lookup=True)
    seen: list[object] = []

    def look_slowly(_: object) -> None:
        expire_lease(fence_db, mid)  # as if the lookup took the whole lease

    def at_send(_: object) -> None:
        seen.append(row(fence_db, mid)["lease_expires_at"])

    provider.on_lookup, provider.on_send = look_slowly, at_send
    assert deliver(service, mid, "renew").status == "sent"
    [lease] = seen
    assert isinstance(lease, dt.datetime) and lease > utcnow() + dt.timedelta(seconds=500)


def test_message_of_a_provider_no_longer_configured_ends_dead(fence_db: Engine) -> None:
    """A message whose provider was removed from the config ends ``dead`` with
    PROVIDER_NOT_CONFIGURED at once, without a call, instead of cycling forever."""
    provider = ProviderStub()
    service = service_on(fence_db, provider)
    mid = add_row(fence_db, "gone-1", "dispatched", provider="retired", attempts=2)
    result = deliver(service, mid, "gone-1")
    assert (result.action, result.status, result.code) == (
        Action.DONE,
        "dead",
        PROVIDER_NOT_CONFIGURED,
    )
    got = row(fence_db, mid)
    assert (got["status"], got["last_error_code"], got["attempts"]) == (
        "dead",
        PROVIDER_NOT_CONFIGURED,
        2,
    )
    assert "retired" in str(got["last_error"]) and provider.sends == []


def _pigeon(in_progress: bool) -> PigeonProvider:
    def answer(request: httpx.Request) -> httpx.Response:
        if in_progress:
            body = {"error": "in flight", "code": "IDEMPOTENCY_IN_PROGRESS"}
            return httpx.Response(409, json=body)
        return httpx.Response(200, json={"emailId": 77})

    config = ProviderConfig(
        "stub", "pigeon", "http://127.0.0.1:9", Timeouts(), api_key_env="FENCE_PIGEON_KEY"
    )
    os.environ["FENCE_PIGEON_KEY"] = "k"
    return PigeonProvider(config, httpx.MockTransport(answer))


def test_pigeon_in_progress_waits_its_budget_without_spending_attempts(fence_db: Engine) -> None:
    """Pigeon's 409 IDEMPOTENCY_IN_PROGRESS on the last attempt does not end ``dead``: the row
    waits out pigeon's SMTP budget, its attempt is given back, and it is asked again."""
    pigeon = _pigeon(in_progress=True)
    service = service_on(fence_db, pigeon)  # type: ignore[arg-type]
    mid = add_row(fence_db, "pigeon-409", "dispatched", channel="email", max_attempts=1)
    result = deliver(service, mid, "pigeon-409")
    assert result.action is Action.RETRY and result.status == "dispatched", result
    assert result.delay == pytest.approx(SMTP_BUDGET + 5.0)
    got = row(fence_db, mid)
    assert (got["attempts"], got["max_attempts"]) == (1, 2)
    assert got["last_error_code"] == "IDEMPOTENCY_IN_PROGRESS"
    assert service.breaker("stub").allow().allowed


def test_worker_start_fails_loudly_without_a_provider_secret(tmp_path: Path) -> None:
    """A worker whose config names a secret that is not in its environment exits at start
    with the dotted key and the variable's name, before taking any task."""
    from delivery.testing.processes import worker

    config = tmp_path / "d.toml"
    config.write_text(
        '[providers.mail]\nkind = "pigeon"\nbase_url = "http://127.0.0.1:9"\n'
        'api_key_env = "FENCE_UNSET_KEY"\n[channels.email]\nprovider = "mail"\n'
    )
    env = {**os.environ, "DELIVERY_CONFIG": str(config)}
    env.pop("FENCE_UNSET_KEY", None)
    root = Path(__file__).resolve().parent.parent
    proc = worker(tmp_path / "w.log", env=env, cwd=root, concurrency=1)
    with pytest.raises(RuntimeError, match="did not start"):
        proc.start(timeout=60)
    out = proc.output()
    assert "providers.mail.api_key_env" in out and "FENCE_UNSET_KEY" in out


def test_check_secrets_names_every_missing_variable() -> None:
    """``check_secrets`` passes when every secret is set and otherwise names the dotted key
    and variable of each missing one (api_key_env and adapters' own ``*_env`` keys); the
    receipts' secret is the receiver's to check, not a worker's."""
    import delivery

    base, t = delivery.get_settings(), Timeouts()
    providers = {
        "mail": ProviderConfig("mail", "pigeon", "http://x", t, api_key_env="MAIL_KEY"),
        "sms": ProviderConfig(
            "sms", "twilio", "http://x", t, options={"auth_token_env": "TW_TOKEN"}
        ),
        "hooks": ProviderConfig("hooks", "webhook", "", t, options={"secret_env": "HOOK_SECRET"}),
        "ref": ProviderConfig("ref", "http", "http://x", t, options={"receipt_secret_env": "R"}),
    }
    settings = base.with_(providers=providers)
    full = {"MAIL_KEY": "a", "TW_TOKEN": "b", "HOOK_SECRET": "c"}
    check_secrets(settings, full)
    with pytest.raises(ConfigError) as raised:
        check_secrets(settings, {"MAIL_KEY": "a", "TW_TOKEN": " "})
    assert raised.value.key == "providers.sms.auth_token_env"
    assert "TW_TOKEN" in str(raised.value) and "providers.hooks.secret_env" in str(raised.value)
    assert "HOOK_SECRET" in str(raised.value) and " b" not in str(raised.value)


def test_leases_and_due_times_use_the_database_clock(
    fence_db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With this host's clock an hour ahead, the sweeper ends no live lease and the relay
    claims no row that is not due yet by the database's clock."""
    from delivery.core import models
    from delivery.relay import claims as relay_module
    from delivery.relay import sweeper
    from delivery.transitions import fence, recovery, worker

    ahead = lambda: dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)  # noqa: E731
    now = utcnow()
    live = add_row(fence_db, "clock-live", "sending", attempts=1)
    with fence_db.begin() as conn:
        conn.execute(
            update(messages_table)
            .where(messages_table.c.id == live)
            .values(lease_expires_at=now + dt.timedelta(minutes=5))
        )
    later = add_row(fence_db, "clock-later", next_attempt_at=now + dt.timedelta(minutes=30))
    for module in (models, relay_module, sweeper, fence, recovery, worker):
        monkeypatch.setattr(module, "utcnow", ahead, raising=False)
    report = sweep(fence_db)
    assert (report.recovered, report.unknown, report.requeued) == (0, 0, 0)
    assert relay(fence_db) == []
    assert row(fence_db, live)["status"] == "sending"
    assert row(fence_db, later)["status"] == "pending"
