"""``enqueue_many`` on real PostgreSQL (and the embedded SQLite): one INSERT per chunk, read
lazily from its iterable, ``enqueue``'s validation and idempotency, nothing written on error.

Every message is due an hour from now, so a live relay of the suite never publishes them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session

import delivery
from delivery.core.models import Message
from delivery.outbox import bulk
from delivery.outbox import enqueue as outbox
from tests.test_enqueue import Publisher

LATER = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)


def spec(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "channel": "sms",
        "to": f"+1201555{i % 10000:04d}",
        "payload": {"body": f"campaign {i}"},
        "key": f"bulk-{i}",
        "send_at": LATER,
        **extra,
    }


class Inserts:
    """Counts the INSERT statements an engine runs."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        self.engine = engine
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO DELIVERY_MESSAGES"):
            self.count += 1

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


@pytest.fixture
def inserts(clean: Engine) -> Iterator[Inserts]:
    counter = Inserts(clean)
    yield counter
    counter.close()


def _count(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(Message)) or 0)


@pytest.mark.integration
def test_one_insert_per_chunk_read_lazily(clean: Engine, inserts: Inserts) -> None:
    """2,500 messages are three INSERT statements, and the iterable is read at most two chunks
    ahead of the writes (the chunk being inserted and the next, validated meanwhile; never
    whole)."""
    pulled: list[int] = []
    at_first_insert: list[int] = []

    def messages() -> Iterator[dict[str, Any]]:
        for i in range(2500):
            if inserts.count and not at_first_insert:
                at_first_insert.append(len(pulled))
            pulled.append(i)
            yield spec(i)

    with Session(clean) as session, session.begin():
        done = delivery.enqueue_many(session, messages())
    assert done == delivery.Enqueued(created=2500, existing=0)
    assert inserts.count == 3
    assert at_first_insert and at_first_insert[0] <= 2 * bulk.CHUNK + 1
    assert _count(clean) == 2500


#: The columns a message's arguments decide (keys and times aside).
_DECIDED = (
    "channel",
    "provider",
    "recipient",
    "payload",
    "payload_hash",
    "on_unknown",
    "status",
    "attempts",
    "max_attempts",
    "budget_start",
    "needs_lookup",
    "message_type",
    "priority",
)


def _stored(engine: Engine, prefix: str) -> list[tuple[Any, ...]]:
    m = Message.__table__.c
    with Session(engine) as session:
        rows = session.execute(
            select(m.key, m.next_attempt_at, m.expires_at, m.created_at, m.updated_at, m.id)
            .add_columns(*(m[name] for name in _DECIDED))
            .where(m.key.like(prefix + "%"))
            .order_by(m.id)
        ).all()
    found = []
    for key, due, expires, created, updated, _, *decided in rows:
        assert created == updated
        after = None if expires is None else expires - due
        found.append((key.removeprefix(prefix), due, after, *decided))
    return found


@pytest.mark.integration
@pytest.mark.parametrize("size", [1, 7, 1200])
def test_each_row_is_the_row_enqueue_writes(clean: Engine, size: int) -> None:
    """Whatever varies from message to message (every argument, or only the key), each row
    enqueue_many writes is the row enqueue writes for the same arguments: a chunk sends a
    value shared by all its rows once, and the rest as arrays."""
    later = [LATER + dt.timedelta(minutes=i % 3) for i in range(3)]

    def mixed(i: int) -> dict[str, Any]:
        varied: dict[str, Any] = {
            "to": f"+1201555{i % 7:04d}",
            "payload": {"body": f"x{i % 5}", "n": i % 2},
            "key": f"{i}",
            "send_at": later[i % 3],
        }
        if i % 3 == 1:
            varied.update(type="marketing")
        elif i % 3 == 2:
            varied.update(channel="sms", max_attempts=2 + i % 4, on_unknown="give_up")
        else:
            varied.update(channel="sms")
        return varied

    def same(i: int) -> dict[str, Any]:
        return {
            "channel": "sms",
            "to": "+12015550100",
            "payload": {"body": "b"},
            "key": f"{i}",
            "send_at": LATER,
        }

    for name, make in (("mixed", mixed), ("same", same)):
        with Session(clean) as session, session.begin():
            for i in range(size):
                args = make(i)
                delivery.enqueue(session, **{**args, "key": f"one-{name}-{args['key']}"})
            messages = []
            for i in range(size):
                args = make(i)
                messages.append({**args, "key": f"many-{name}-{args['key']}"})
            assert delivery.enqueue_many(session, messages).created == size
        one, many = _stored(clean, f"one-{name}-"), _stored(clean, f"many-{name}-")
        assert len(one) == size and many == one


@pytest.mark.integration
def test_same_key_same_payload_is_the_existing_message(clean: Engine) -> None:
    """A key already enqueued with the same payload, or repeated in the input, is not written
    again: counted as existing."""
    with Session(clean) as session, session.begin():
        delivery.enqueue(session, **spec(0))
    with Session(clean) as session, session.begin():
        done = delivery.enqueue_many(session, [spec(0), spec(1), spec(1)])
    assert done == delivery.Enqueued(created=1, existing=2)
    assert _count(clean) == 2


@pytest.mark.integration
def test_a_conflict_names_the_key_and_writes_nothing(clean: Engine) -> None:
    """A key bound to another payload (already stored, or twice in the input, even in a later
    chunk) raises IdempotencyConflict naming it; nothing of the call is written and the
    caller's transaction goes on."""
    with Session(clean) as session, session.begin():
        delivery.enqueue(session, **spec(0))
    late = bulk.CHUNK + 5
    cases = [
        [spec(1), spec(0, payload={"body": "other"})],
        [spec(i) for i in range(1, late)] + [spec(3, payload={"body": "changed"})],
    ]
    for messages in cases:
        with Session(clean) as session, session.begin():
            with pytest.raises(delivery.IdempotencyConflict) as raised:
                delivery.enqueue_many(session, messages)
            assert raised.value.key in ("bulk-0", "bulk-3")
            delivery.enqueue(session, **spec(9999))  # the transaction is still usable
        assert _count(clean) == 2
        with Session(clean) as session, session.begin():
            session.execute(Message.__table__.delete().where(Message.key == "bulk-9999"))


@pytest.mark.integration
@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"to": "not-a-number"}, "messages[1200].to"),
        ({"channel": "pigeon"}, "messages[1200].channel"),
        ({"max_attempts": 0}, "messages[1200].max_attempts"),
        ({"colour": "red"}, "messages[1200].colour"),
    ],
)
def test_bad_input_names_the_message_and_field_and_writes_nothing(
    clean: Engine, bad: dict[str, Any], field: str
) -> None:
    """A bad message after a whole chunk was written (or was being written while the next
    was validated) raises InvalidMessage naming its place and field; the chunk already written
    is rolled back with it, and the caller's transaction goes on."""
    messages = [spec(i) for i in range(1300)]
    messages[1200] = {**messages[1200], **bad}
    with Session(clean) as session, session.begin():
        with pytest.raises(delivery.InvalidMessage) as raised:
            delivery.enqueue_many(session, messages)
        delivery.enqueue(session, **spec(9999))
    assert raised.value.field == field
    assert _count(clean) == 1


@pytest.mark.integration
def test_messages_may_come_from_a_query_on_the_same_session(clean: Engine) -> None:
    """A generator that queries the database through the caller's own session while it yields
    (a campaign streamed from the app's tables) works: the iterable is read between
    statements, never while one is in flight."""
    with Session(clean) as session, session.begin():

        def messages() -> Iterator[dict[str, Any]]:
            for i in range(2500):
                if i % 700 == 0:  # in the middle of chunks, and at their edges
                    seen = session.scalar(select(func.count()).select_from(Message))
                    assert seen is not None and seen <= i
                yield spec(i)

        done = delivery.enqueue_many(session, messages())
    assert done == delivery.Enqueued(created=2500, existing=0)
    assert _count(clean) == 2500


def test_enqueue_many_on_the_embedded_sqlite_outbox(session: Session) -> None:
    """The embedded default takes enqueue_many too, with the same conflict rule."""
    done = delivery.enqueue_many(session, [spec(i) for i in range(1500)])
    session.commit()
    assert done.created == 1500
    with pytest.raises(delivery.IdempotencyConflict):
        delivery.enqueue_many(session, [spec(1, payload={"body": "other"})])
    session.rollback()
    assert session.scalar(select(func.count()).select_from(Message)) == 1500


@pytest.mark.integration
def test_the_first_due_rows_are_written_claimed_for_the_nudge(
    clean: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a nudge installed, the transaction's first NUDGE_MAX due messages are written
    dispatched (across chunks) and handed to the publisher after the commit, once each; a
    message due later, a repeated key and those past the cap are pending for the relay."""
    publisher = Publisher()
    monkeypatch.setattr(outbox, "_nudge", publisher)
    monkeypatch.setattr(outbox, "NUDGE_MAX", 3)
    monkeypatch.setattr(bulk, "CHUNK", 2)
    due = {"send_at": None}
    messages = [spec(0, **due), spec(1), spec(2, **due), spec(0, **due), spec(3, **due)]
    messages.append(spec(4, **due))
    with Session(clean) as session, session.begin():
        done = delivery.enqueue_many(session, messages)
        assert publisher.claims == []
    assert done == delivery.Enqueued(created=5, existing=1)
    assert [c.key for c in publisher.claims] == ["bulk-0", "bulk-2", "bulk-3"]
    m = Message.__table__.c
    with clean.connect() as conn:
        rows = dict(
            conn.execute(select(m.key, m.status).where(m.lease_expires_at.is_not(None))).all()
        )
        statuses = dict(conn.execute(select(m.key, m.status)).all())
    assert rows == {"bulk-0": "dispatched", "bulk-2": "dispatched", "bulk-3": "dispatched"}
    assert statuses["bulk-1"] == statuses["bulk-4"] == "pending"
