"""``enqueue`` and configuration: validation, idempotency, and the caller's transaction."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

import delivery
from delivery.config.loading import load_settings
from delivery.core.models import Message
from delivery.errors import ConfigError, IdempotencyConflict, InvalidMessage
from delivery.observability import events
from delivery.outbox import enqueue as outbox
from delivery.relay.claims import Claim
from delivery.runtime.db import make_engine, upgrade

SMS = dict(channel="sms", to="+12015550123", payload={"body": "hello"})


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path}/outbox.sqlite3")
        upgrade(engine)
        yield engine
        engine.dispose()
    else:
        yield request.getfixturevalue("clean")


def count(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(Message)) or 0)


def test_enqueue_adds_without_committing(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """enqueue writes into the caller's transaction and never commits it."""
    monkeypatch.setattr(outbox, "_nudge", None)  # without a nudge a new row is pending
    with Session(engine) as session:
        message = delivery.enqueue(session, **SMS)  # type: ignore[arg-type]
        assert message.id and message.status == "pending" and len(message.key) == 36
        session.rollback()
    assert count(engine) == 0


def test_same_key_same_payload_returns_existing(engine: Engine) -> None:
    """Enqueueing the same key and payload twice gives back the first message."""
    with Session(engine) as session, session.begin():
        first_id = delivery.enqueue(session, key="order-42:receipt", **SMS).id  # type: ignore[arg-type]
    with Session(engine) as session, session.begin():
        again_id = delivery.enqueue(session, key="order-42:receipt", **SMS).id  # type: ignore[arg-type]
    assert again_id == first_id and count(engine) == 1


def test_same_key_other_payload_conflicts_and_keeps_transaction(engine: Engine) -> None:
    """A key reused with another payload raises and leaves the transaction usable."""
    with Session(engine) as session, session.begin():
        delivery.enqueue(session, key="k1", **SMS)  # type: ignore[arg-type]
    with Session(engine) as session, session.begin():
        with pytest.raises(IdempotencyConflict, match="k1"):
            delivery.enqueue(
                session, key="k1", channel="sms", to="+12015550123", payload={"body": "other"}
            )
        delivery.enqueue(session, key="k2", **SMS)  # type: ignore[arg-type]
    assert count(engine) == 2


BAD = [
    ("channel", dict(SMS, channel="fax")),
    ("provider", dict(SMS, provider="nope")),
    ("on_unknown", dict(SMS, on_unknown="pray")),
    ("to", dict(SMS, to="555-1234")),
    ("to", dict(SMS, to="+1555")),
    ("to", dict(channel="email", to="not-an-address", payload={"body": "x"})),
    ("to", dict(channel="webhook", to="https://user:pw@example.com/h", payload={"a": 1})),
    ("payload.body", dict(SMS, payload={"body": ""})),
    ("payload", dict(SMS, payload={"body": "x" * 70_000})),
    ("payload", dict(SMS, payload={"body": "x", "when": dt.date(2026, 1, 1)})),
    ("key", dict(SMS, key="k" * 256)),
    ("max_attempts", dict(SMS, max_attempts=0)),
    ("send_at", dict(SMS, send_at=dt.datetime(2026, 1, 1))),
]


@pytest.mark.parametrize(("field", "kwargs"), BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_bad_input_names_the_field_and_writes_nothing(
    engine: Engine, field: str, kwargs: dict[str, object]
) -> None:
    """Each bad input raises InvalidMessage naming its field; nothing is written."""
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidMessage) as info:
            delivery.enqueue(session, **kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
        delivery.enqueue(session, key="still-usable", **SMS)  # type: ignore[arg-type]
    assert count(engine) == 1


def test_send_at_in_the_future_is_held(engine: Engine) -> None:
    """A future send_at becomes the row's next_attempt_at, in UTC."""
    when = dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    with Session(engine) as session, session.begin():
        message_id = delivery.enqueue(session, send_at=when, **SMS).id  # type: ignore[arg-type]
    with Session(engine) as session:
        stored = session.get(Message, message_id)
        assert stored is not None and stored.next_attempt_at == when


class Publisher:
    """A nudge's publisher that records what it is handed (and fails when told to)."""

    def __init__(self, fail: bool = False) -> None:
        self.claims: list[Claim] = []
        self.fail = fail

    def __call__(self, claims: Sequence[Claim]) -> object:
        if self.fail:
            raise ConnectionError("broker down")
        self.claims.extend(claims)
        return None


@pytest.fixture
def nudge(monkeypatch: pytest.MonkeyPatch) -> Publisher:
    publisher = Publisher()
    monkeypatch.setattr(outbox, "_nudge", publisher)
    return publisher


def stored(engine: Engine, key: str) -> tuple[str, dt.datetime | None, dt.datetime]:
    with Session(engine) as session:
        row = session.scalars(select(Message).where(Message.key == key)).one()
        return row.status, row.lease_expires_at, row.created_at


def test_with_the_nudge_a_due_row_is_written_claimed_and_only_published(
    engine: Engine, nudge: Publisher
) -> None:
    """With a nudge installed, a due message is written dispatched with the relay's lease
    (dispatch_lease from its creation) and after the commit the publisher gets its claim;
    a message due later is written pending and left to the relay."""
    lease = dt.timedelta(seconds=delivery.get_settings().dispatch_lease)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with Session(engine) as session, session.begin():
        now = delivery.enqueue(session, key="claimed", **SMS)  # type: ignore[arg-type]
        held = delivery.enqueue(session, key="held", send_at=later, **SMS)  # type: ignore[arg-type]
        assert (now.status, now.lease_expires_at) == ("dispatched", now.created_at + lease)
        assert (held.status, held.lease_expires_at) == ("pending", None)
        assert nudge.claims == []  # nothing before the commit
        claim = Claim(now.id, "claimed", "normal", now.provider, 0)
    assert nudge.claims == [claim]
    status, until, created = stored(engine, "claimed")
    assert (status, until) == ("dispatched", created + lease)
    assert stored(engine, "held")[:2] == ("pending", None)


def test_a_failed_publish_gives_the_row_back_to_the_relay_at_once(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish that fails after the commit puts the claimed row back to pending, without
    waiting for its lease; the commit itself succeeded. Each move is announced once: the
    claim, then the give-back (hooks and metrics count them)."""
    monkeypatch.setattr(outbox, "_nudge", Publisher(fail=True))
    seen: list[delivery.Transition] = []
    hook = seen.append
    delivery.add_hook(hook)
    try:
        with Session(engine) as session, session.begin():
            delivery.enqueue(session, key="given-back", **SMS)  # type: ignore[arg-type]
    finally:
        events.remove_hook(hook)
    assert stored(engine, "given-back")[:2] == ("pending", None)
    moves = [(t.from_status, t.to_status) for t in seen if t.key == "given-back"]
    assert moves == [("pending", "dispatched"), ("dispatched", "pending")]


def test_a_rollback_publishes_nothing(engine: Engine, nudge: Publisher) -> None:
    with Session(engine) as session, session.begin():
        delivery.enqueue(session, key="rolled-back", **SMS)  # type: ignore[arg-type]
        session.rollback()
    with Session(engine) as session, session.begin():
        delivery.enqueue(session, key="next", **SMS)  # type: ignore[arg-type]
    assert [c.key for c in nudge.claims] == ["next"]


def test_existing_keys_and_conflicts_are_not_published(engine: Engine, nudge: Publisher) -> None:
    """The same key again returns the stored message and publishes nothing more; a conflict
    leaves the transaction usable and its other new message is published."""
    with Session(engine) as session, session.begin():
        delivery.enqueue(session, key="once", **SMS)  # type: ignore[arg-type]
    with Session(engine) as session, session.begin():
        again = delivery.enqueue(session, key="once", **SMS)  # type: ignore[arg-type]
        with pytest.raises(IdempotencyConflict):
            delivery.enqueue(
                session, key="once", channel="sms", to="+12015550123", payload={"body": "b"}
            )
        other = delivery.enqueue(session, key="other", **SMS)  # type: ignore[arg-type]
        ids = [again.id, other.id]
    assert [c.id for c in nudge.claims] == ids


def test_a_transaction_claims_at_most_nudge_max_rows(
    engine: Engine, nudge: Publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox, "NUDGE_MAX", 2)
    with Session(engine) as session, session.begin():
        for i in range(3):
            delivery.enqueue(session, key=f"cap-{i}", **SMS)  # type: ignore[arg-type]
    assert [c.key for c in nudge.claims] == ["cap-0", "cap-1"]
    assert stored(engine, "cap-2")[:2] == ("pending", None)


def test_a_session_on_a_connection_leaves_its_rows_to_the_relay(
    engine: Engine, nudge: Publisher
) -> None:
    """On a connection the session's commit may not be the transaction's, so its rows are
    written pending for the relay, and nothing is published."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))  # the caller's transaction, begun before the session
        with Session(bind=conn) as session:
            delivery.enqueue(session, key="on-a-connection", **SMS)  # type: ignore[arg-type]
            session.commit()
        conn.commit()
    assert nudge.claims == []
    assert stored(engine, "on-a-connection")[:2] == ("pending", None)


def write(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "delivery.toml"
    path.write_text(text)
    return {"DELIVERY_CONFIG": str(path)}


def test_issue_toml_loads(tmp_path: Path) -> None:
    """The documented minimal TOML gives an http provider and an sms channel."""
    settings = load_settings(
        write(
            tmp_path,
            """
[providers.stub]
kind = "http"
base_url = "http://127.0.0.1:9090"

[channels.sms]
provider = "stub"
on_unknown = "retry"
""",
        )
    )
    assert settings.providers["stub"].base_url == "http://127.0.0.1:9090"
    assert settings.channels["sms"].on_unknown == "retry"
    assert settings.database_url.startswith("sqlite:///")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[providers.s]\nbase_url = "http://x"\n', "providers.s.kind"),
        ('[providers.s]\nkind = "carrier-pigeon"\nbase_url = "http://x"\n', "providers.s.kind"),
        ('[providers.s]\nkind = "http"\nbase_url = "ftp://x"\n', "providers.s.base_url"),
        (
            '[providers.s]\nkind = "http"\nbase_url = "http://x"\n[channels.sms]\nprovider = "t"\n',
            "channels.sms.provider",
        ),
        (
            '[providers.s]\nkind = "http"\nbase_url = "http://x"\n[channels.sms]\nprovider = "s"\n'
            'on_unknown = "maybe"\n',
            "channels.sms.on_unknown",
        ),
        ('[backoff]\nbase = "fast"\n', "backoff.base"),
        ("[timeouts]\nread = -1\n", "timeouts.read"),
        ("[delivery]\nmax_atempts = 3\n", "delivery.max_atempts"),
        ("[delivery]\nsend_lease = 2\n", "delivery.send_lease"),
        ('[channels.fax]\nprovider = "stub"\n', "channels.fax"),
        ("[providers\n", "DELIVERY_CONFIG"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    """A wrong or missing setting fails at start-up with its dotted key in the message."""
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    assert info.value.key == key and key in str(info.value)


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    """DELIVERY_CONFIG pointing nowhere is a ConfigError, not a traceback."""
    with pytest.raises(ConfigError, match="DELIVERY_CONFIG"):
        load_settings({"DELIVERY_CONFIG": str(tmp_path / "missing.toml")})


def test_secret_is_read_from_environment_only(tmp_path: Path) -> None:
    """api_key_env names a variable; the secret itself is never part of the settings."""
    env = write(
        tmp_path, '[providers.p]\nkind = "http"\nbase_url = "http://x"\napi_key_env = "P_KEY"\n'
    )
    settings = load_settings({**env, "P_KEY": "s3cret"})
    assert "s3cret" not in repr(settings)
    assert settings.providers["p"].api_key({"P_KEY": "s3cret"}) == "s3cret"
    assert json.dumps(str(settings)).count("s3cret") == 0
