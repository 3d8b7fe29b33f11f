"""The ops commands added for on-call work: stats by provider, bulk redrive, resolve, cancel,
prune and watch; against a temporary SQLite outbox, plus the repairs on PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from delivery import ops
from delivery.cli import main
from delivery.core.models import Attempt, Message, utcnow
from delivery.observability.events import Transition, add_hook, remove_hook
from delivery.runtime.db import make_sessionmaker
from tests.factories import STATUSES, add

RECIPIENT = "+15555550123"


def attempt(session: Session, message: Message, number: int = 1) -> None:
    session.add(
        Attempt(
            message_id=message.id,
            number=number,
            kind="send",
            started_at=utcnow(),
            outcome="permanent",
            http_status=400,
        )
    )
    session.commit()


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def status_of(session: Session, key: str) -> str:
    session.expire_all()
    return session.scalars(select(Message.status).where(Message.key == key)).one()


def ago(**kwargs: float) -> dt.datetime:
    return utcnow() - dt.timedelta(**kwargs)


# --- stats --------------------------------------------------------------------------------


def test_stats_by_provider_adds_keys_and_keeps_status_counts(session: Session) -> None:
    """``stats --by-provider --json`` keeps the flat status counts and adds per-provider
    counts and the oldest pending age; plain ``stats --json`` is unchanged."""
    add(session, "a", "pending", created_at=ago(minutes=5))
    add(session, "b", "sent", provider="twilio")
    add(session, "c", "dead", provider="twilio")

    plain = json.loads(run("stats", "--json").output)
    assert list(plain) == STATUSES

    result = run("stats", "--by-provider", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {k: data[k] for k in STATUSES} == plain
    assert data["by_provider"]["stub"]["pending"] == 1
    assert data["by_provider"]["twilio"] == dict.fromkeys(STATUSES, 0) | {"sent": 1, "dead": 1}
    assert data["oldest_pending_age_seconds"] == pytest.approx(300, abs=10)

    table = run("stats", "--by-provider")
    assert table.exit_code == 0, table.output
    assert (
        "twilio" in table.output
        and "oldest due message: 5 min (pending or in flight, and due;" in table.output
    )


def test_oldest_pending_age_ignores_final_and_future_messages(session: Session) -> None:
    """The oldest pending age counts open messages only, not ones scheduled for later."""
    assert ops.oldest_pending_age(session) is None
    add(session, "old-sent", "sent", created_at=ago(hours=5))
    add(session, "later", "pending", created_at=ago(hours=4), next_attempt_at=ago(hours=-1))
    add(session, "retrying", "pending", created_at=ago(minutes=3), attempts=2)
    add(session, "in-flight", "sending", created_at=ago(minutes=2), attempts=1)
    assert ops.oldest_pending_age(session) == pytest.approx(180, abs=5)
    assert ops.relay_lag(session) == pytest.approx(0, abs=5)
    add(session, "overdue", "pending", next_attempt_at=ago(seconds=90))
    assert ops.relay_lag(session) == pytest.approx(90, abs=5)


# --- redrive ------------------------------------------------------------------------------


def test_redrive_all_dead_filters_by_code_and_since(session: Session) -> None:
    """``redrive --all-dead --code`` redrives every matching dead message and nothing else."""
    for i in range(3):
        add(session, f"rej-{i}", "dead", last_error_code="21211")
    add(session, "rej-old", "dead", last_error_code="21211", updated_at=ago(days=3))
    add(session, "exhausted", "dead", last_error_code="EXHAUSTED")
    add(session, "unknown", "unknown", last_error_code="21211")

    result = run("redrive", "--all-dead", "--code", "21211", "--since", "1d", "--json")

    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert sorted(r["key"] for r in rows) == ["rej-0", "rej-1", "rej-2"]
    assert all(r["redriven"] and r["from_status"] == "dead" for r in rows)
    assert [status_of(session, f"rej-{i}") for i in range(3)] == ["pending"] * 3
    assert status_of(session, "rej-old") == "dead"
    assert status_of(session, "exhausted") == "dead"
    assert status_of(session, "unknown") == "unknown"


def test_redrive_dry_run_changes_nothing(session: Session) -> None:
    """``--dry-run`` lists what would be redriven, for refs and for ``--all-dead``, never
    claims ``redriven: true`` for a row it did not touch, and writes nothing (no audit row)."""
    add(session, "d1", "dead")
    add(session, "d2", "dead")
    add(session, "s1", "sent")

    bulk = run("redrive", "--all-dead", "--dry-run", "--json")
    assert bulk.exit_code == 0, bulk.output
    assert sorted(r["key"] for r in json.loads(bulk.stdout)) == ["d1", "d2"]
    assert all(not r["redriven"] and r["would_redrive"] for r in json.loads(bulk.stdout))
    table = run("redrive", "--all-dead", "--dry-run")
    assert "would redrive 2 dead messages" in table.output

    refs = run("redrive", "d1", "s1", "--dry-run", "--json")
    assert refs.exit_code == 1
    assert [(r["key"], r["redriven"], r["would_redrive"]) for r in json.loads(refs.stdout)] == [
        ("d1", False, True),
        ("s1", False, False),
    ]
    assert [status_of(session, k) for k in ("d1", "d2", "s1")] == ["dead", "dead", "sent"]
    assert ops.entries(session) == []


def test_redrive_all_dead_in_bulk_reports_a_count(session: Session) -> None:
    """Bulk redrive of more than one batch redrives all of them and prints one summary."""
    session.add_all(
        Message(
            key=f"bulk-{i}",
            channel="sms",
            provider="stub",
            recipient=RECIPIENT,
            payload={"body": "hi"},
            payload_hash="x",
            on_unknown="retry",
            status="dead",
            attempts=5,
            max_attempts=5,
            needs_lookup=False,
            next_attempt_at=utcnow(),
            created_at=utcnow(),
            updated_at=utcnow(),
        )
        for i in range(1203)
    )
    session.commit()

    result = run("redrive", "--all-dead")

    assert result.exit_code == 0, result.output
    assert "redriven 1203 of 1203 dead messages" in result.output
    assert ops.stats(session)["pending"] == 1203


def test_redrive_needs_refs_or_all_dead(db_url: str) -> None:
    """``redrive`` with neither refs nor ``--all-dead`` (or ``--code`` without it) is a usage
    error."""
    assert run("redrive").exit_code == 2
    both = run("redrive", "k", "--all-dead")
    assert both.exit_code == 2 and "--all-dead" in both.output
    assert run("redrive", "k", "--code", "X").exit_code == 2


# --- resolve and cancel -------------------------------------------------------------------


def test_resolve_unknown_as_sent_or_dead(session: Session) -> None:
    """``resolve --as sent|dead`` settles unknown messages, emits a transition, and refuses
    any other status with exit 1."""
    add(session, "u-sent", "unknown", attempts=2)
    add(session, "u-dead", "unknown", attempts=2, last_error_code="TIMEOUT")
    add(session, "pending", "pending")
    seen: list[Transition] = []
    add_hook(seen.append)
    try:
        as_sent = run("resolve", "u-sent", "--as", "sent", "--json")
        as_dead = run("resolve", "u-dead", "--as", "dead")
        refused = run("resolve", "pending", "--as", "sent", "--json")
    finally:
        remove_hook(seen.append)

    assert as_sent.exit_code == 0, as_sent.output
    assert json.loads(as_sent.output)["resolved"] is True
    assert as_dead.exit_code == 0 and "unknown -> dead" in as_dead.output
    session.expire_all()
    sent = session.scalars(select(Message).where(Message.key == "u-sent")).one()
    assert sent.status == "sent" and sent.sent_at is not None
    assert status_of(session, "u-dead") == "dead"
    assert [(t.key, t.to_status, t.outcome) for t in seen] == [
        ("u-sent", "sent", "resolve"),
        ("u-dead", "dead", "resolve"),
    ]
    assert refused.exit_code == 1
    assert "only unknown" in json.loads(refused.output)["reason"]
    assert status_of(session, "pending") == "pending"
    assert run("resolve", "u-sent", "--as", "pending").exit_code == 2


def test_cancel_pending_only_and_too_late_once_dispatched(session: Session) -> None:
    """``cancel`` turns pending into cancelled; a dispatched or sent message is reported (too
    late / already final) with exit 1 and left alone."""
    add(session, "p1", "pending")
    add(session, "d1", "dispatched")
    add(session, "s1", "sent")

    ok = run("cancel", "p1", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)[0]["cancelled"] is True
    assert status_of(session, "p1") == "cancelled"

    late = run("cancel", "d1", "s1", "--json")
    assert late.exit_code == 1
    rows = json.loads(late.stdout)
    assert [(r["key"], r["cancelled"], r["too_late"]) for r in rows] == [
        ("d1", False, True),
        ("s1", False, False),
    ]
    assert "too late" in rows[0]["reason"]
    assert (status_of(session, "d1"), status_of(session, "s1")) == ("dispatched", "sent")
    assert "too late" in run("cancel", "d1").output
    assert run("cancel", "nope").exit_code == 2


# --- prune --------------------------------------------------------------------------------


def test_prune_deletes_old_final_messages_with_attempts_never_open(session: Session) -> None:
    """``prune --older-than`` deletes final messages older than the cutoff and their attempts,
    in batches, and keeps recent ones and every open one however old."""
    old = ago(days=40)
    for i, status in enumerate(["sent", "dead", "unknown", "cancelled"] * 3):
        attempt(session, add(session, f"old-{i}", status, updated_at=old))
    for status in ("pending", "dispatched", "sending"):
        add(session, f"open-{status}", status, updated_at=old, created_at=old)
    attempt(session, add(session, "recent", "sent"))

    dry = run("prune", "--older-than", "30d", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["messages"] == 12
    assert session.scalar(select(func.count()).select_from(Message)) == 16

    result = run("prune", "--older-than", "30d", "--batch", "5", "--json")

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["messages"], report["attempts"]) == (12, 12)
    session.expire_all()
    left = set(session.scalars(select(Message.key)))
    assert left == {"open-pending", "open-dispatched", "open-sending", "recent"}
    assert session.scalar(select(func.count()).select_from(Attempt)) == 1


def test_prune_bad_duration_names_the_option(db_url: str) -> None:
    """An unparseable ``--older-than`` is a usage error naming that option."""
    result = run("prune", "--older-than", "a month")
    assert result.exit_code == 2
    assert "--older-than" in result.output


# --- watch --------------------------------------------------------------------------------


def test_watch_once_json_and_table(session: Session) -> None:
    """``watch --once`` prints one frame: counts, rates per minute, oldest pending age and
    breaker states; as JSON with ``--json``."""
    add(session, "p", "pending", created_at=ago(minutes=2))
    add(session, "s", "sent", sent_at=utcnow())
    attempt(session, add(session, "d", "dead"))

    result = run("watch", "--once", "--json")

    assert result.exit_code == 0, result.output
    frame = json.loads(result.output)
    assert frame["statuses"]["pending"] == 1 and frame["statuses"]["dead"] == 1
    assert frame["rates_per_minute"] == {"enqueued": 2.0, "sent": 1.0, "dead": 1.0, "attempts": 1.0}
    assert frame["oldest_pending_age_seconds"] == pytest.approx(120, abs=10)
    assert frame["breakers"] == {"stub": "n/a (no DELIVERY_REDIS_URL)"}

    table = run("watch", "--once")
    assert table.exit_code == 0, table.output
    for word in ("pending", "per minute", "oldest due message", "breaker", "stub"):
        assert word in table.output
    assert RECIPIENT not in table.output


# --- PostgreSQL ---------------------------------------------------------------------------


@pytest.mark.integration
def test_repairs_on_postgresql(clean: Engine) -> None:
    """cancel, resolve, prune and the dashboard queries work on PostgreSQL with its locking."""
    with make_sessionmaker(clean)() as session:
        # Due in an hour: the suite's live relay (if it runs) must not take these rows.
        later = utcnow() + dt.timedelta(hours=1)
        add(session, "pg-pending", "pending", created_at=ago(minutes=1), next_attempt_at=later)
        add(session, "pg-unknown", "unknown")
        for i in range(7):
            add(session, f"pg-old-{i}", "dead", updated_at=ago(days=60))
        add(
            session,
            "pg-open-old",
            "pending",
            updated_at=ago(days=60),
            attempts=1,
            next_attempt_at=later,
        )

        assert ops.cancel(session, "pg-pending").cancelled
        assert ops.resolve(session, "pg-unknown", "dead").resolved
        session.commit()
        assert ops.prunable(session, ago(days=30)) == 7
        batches = []
        while (done := ops.prune_batch(session, ago(days=30), limit=3)).messages:
            session.commit()
            batches.append(done.messages)
        assert batches == [3, 3, 1]
        assert ops.stats_by_provider(session)["stub"] == dict.fromkeys(STATUSES, 0) | {
            "pending": 1,
            "dead": 1,
            "cancelled": 1,
        }
        assert ops.oldest_pending_age(session) is not None
        session.commit()
    with clean.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM delivery_messages")) == 3
