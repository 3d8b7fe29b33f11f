"""Message types, time-to-live and scheduled sends."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import delivery
from delivery.config.loading import load_settings
from delivery.core.models import Message, utcnow
from delivery.errors import ConfigError, InvalidMessage
from delivery.relay.sweeper import sweep
from delivery.runtime.db import make_engine, upgrade
from tests.conftest import drained

SMS = dict(to="+12015550123", payload={"body": "482901"})


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path}/outbox.sqlite3")
    upgrade(engine)
    yield engine
    engine.dispose()


def test_type_gives_defaults_and_explicit_arguments_win(sqlite: Engine) -> None:
    """type="otp" brings its channel, priority, attempts and TTL; explicit arguments win."""
    with Session(sqlite, expire_on_commit=False) as session, session.begin():
        otp = delivery.enqueue(session, type="otp", **SMS)  # type: ignore[arg-type]
        own = delivery.enqueue(
            session, type="otp", max_attempts=2, on_unknown="lookup", key="explicit", **SMS
        )  # type: ignore[arg-type]
        bulk = delivery.enqueue(session, type="marketing", key="m", **SMS)  # type: ignore[arg-type]
    assert (otp.channel, otp.priority, otp.max_attempts, otp.message_type) == (
        "sms",
        "urgent",
        10,
        "otp",
    )
    assert otp.expires_at is not None
    assert abs((otp.expires_at - otp.next_attempt_at).total_seconds() - 300) < 1e-3
    assert (own.max_attempts, own.on_unknown) == (2, "lookup")
    assert (bulk.priority, bulk.on_unknown, bulk.expires_at) == ("bulk", "give_up", None)


def test_unknown_type_is_named(sqlite: Engine) -> None:
    """An unconfigured type is InvalidMessage on field 'type'; nothing is written."""
    with Session(sqlite) as session, session.begin():
        with pytest.raises(InvalidMessage) as info:
            delivery.enqueue(session, type="fax-blast", **SMS)  # type: ignore[arg-type]
        assert info.value.field == "type"
        assert session.scalars(select(Message)).all() == []


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[types.otp]\npriority = "urgent"\n', "types.otp.channel"),
        ('[types.otp]\nchannel = "sms"\npriority = "asap"\n', "types.otp.priority"),
        ('[types.otp]\nchannel = "sms"\nttl = 0\n', "types.otp.ttl"),
        (
            '[types.otp]\nchannel = "sms"\n[types.otp.backoff]\nbase = 5\ncap = 1\n',
            "types.otp.backoff.cap",
        ),
        ('[types.otp]\nchannel = "sms"\nretries = 3\n', "types.otp.retries"),
    ],
)
def test_bad_type_config_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    """A wrong message type setting fails at start-up naming its dotted key."""
    path = tmp_path / "d.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings({"DELIVERY_CONFIG": str(path)})
    assert info.value.key == key


def test_sweeper_expires_rows_past_their_ttl(sqlite: Engine) -> None:
    """A pending message whose TTL passed is expired by the sweeper, never sent late."""
    with Session(sqlite) as session, session.begin():
        delivery.enqueue(session, type="otp", key="old", **SMS)  # type: ignore[arg-type]
        delivery.enqueue(session, channel="sms", key="no-ttl", **SMS)  # type: ignore[arg-type]
    report = sweep(sqlite, now=utcnow() + dt.timedelta(seconds=301))
    assert report.expired == 1
    with Session(sqlite) as session:
        statuses = {k: v for k, v in session.execute(select(Message.key, Message.status))}
    assert statuses == {"old": "expired", "no-ttl": "pending"}


@pytest.mark.integration
def test_expired_message_is_not_sent(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """An OTP whose five minutes are already over ends expired with no request made."""
    with Session(live) as session, session.begin():
        delivery.enqueue(
            session,
            type="otp",
            key="stale-otp",
            send_at=utcnow() - dt.timedelta(seconds=301),
            **SMS,
        )  # type: ignore[arg-type]
        delivery.enqueue(session, type="otp", key="fresh-otp", **SMS)  # type: ignore[arg-type]
    assert drained(live, 2, timeout=30) == {"expired": 1, "sent": 1}
    assert stub.effects() == {"fresh-otp": 1}


@pytest.mark.integration
def test_scheduled_send_waits_for_send_at(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """A message with send_at two seconds ahead reaches the provider no earlier."""
    when = utcnow() + dt.timedelta(seconds=2)
    with Session(live) as session, session.begin():
        delivery.enqueue(session, channel="sms", key="later", send_at=when, **SMS)  # type: ignore[arg-type]
    assert drained(live, 1, timeout=30) == {"sent": 1}
    (request,) = stub.requests()
    assert request["at"] >= when.timestamp()


@pytest.mark.integration
def test_urgent_otp_overtakes_a_bulk_backlog(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """An OTP enqueued behind 2,000 marketing messages reaches the provider before most."""
    with Session(live) as session, session.begin():
        for i in range(2000):
            delivery.enqueue(
                session,
                type="marketing",
                key=f"bulk-{i}",
                to=f"+1201555{i:04d}",
                payload={"body": "sale"},
            )
    with Session(live) as session, session.begin():
        delivery.enqueue(session, type="otp", key="otp-urgent", **SMS)  # type: ignore[arg-type]
    drained(live, 2001, timeout=240)
    order = [r["key"] for r in stub.requests() if r["outcome"] == "effect"]
    assert len(order) == 2001
    assert order.index("otp-urgent") < 1000, order.index("otp-urgent")
