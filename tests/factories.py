"""Outbox rows for tests that need a message in a given state without going through
``enqueue`` (ops commands, metrics, the relay)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from delivery.core.models import Attempt, Base, Message, utcnow
from delivery.runtime.partitions import KEYS_TABLE

RECIPIENT = "+15555550123"
#: Every status, in the order ``stats`` reports them: the shape scripts read (``--json``).
STATUSES = [
    "pending",
    "dispatched",
    "sending",
    "sent",
    "dead",
    "unknown",
    "cancelled",
    "expired",
    "delivered",
    "undelivered",
    "suppressed",
]
#: Every table of the outbox, read from the models so that none is left out, the keys table
#: of a partitioned one included (PostgreSQL's test outboxes are:
#: ``delivery.runtime.partitions``); referencing tables first.
OUTBOX_TABLES = ", ".join(
    [KEYS_TABLE, *(table.name for table in reversed(Base.metadata.sorted_tables))]
)


def empty_outbox(conn: Connection, *, restart: bool = False) -> None:
    """Delete every row of the outbox (``restart``: ids start again at 1). ``DELETE``, not
    ``TRUNCATE``: a test leaves a few rows, and a partitioned outbox's ``TRUNCATE`` makes new
    files for each of its dozens of tables and indexes (90 ms against a few)."""
    for table in OUTBOX_TABLES.split(", "):
        conn.execute(text(f"DELETE FROM {table}"))
    if restart:
        conn.execute(
            text("SELECT setval(pg_get_serial_sequence('delivery_messages', 'id'), 1, false)")
        )


def message_values(key: str, status: str = "pending", **fields: Any) -> dict[str, Any]:
    """Every non-null column of a message, with ``fields`` overriding the defaults."""
    now = utcnow()
    values: dict[str, Any] = dict(
        key=key,
        channel="sms",
        provider="stub",
        recipient=RECIPIENT,
        payload={"body": "hi"},
        payload_hash="x",
        on_unknown="retry",
        status=status,
        attempts=0,
        max_attempts=5,
        needs_lookup=False,
        next_attempt_at=now,
        created_at=now,
        updated_at=now,
    )
    values.update(fields)
    return values


def add(session: Session, key: str, status: str, **fields: Any) -> Message:
    """Insert one message and commit."""
    message = Message(**message_values(key, status, **fields))
    session.add(message)
    session.commit()
    return message


def add_attempt(
    session: Session, message_id: int, outcome: str, seconds: float = 0.0, **fields: Any
) -> None:
    """Record a first send attempt of ``message_id``, started ``seconds`` from now, and commit."""
    started = utcnow() + dt.timedelta(seconds=seconds)
    session.add(
        Attempt(
            message_id=message_id,
            number=1,
            kind="send",
            started_at=started,
            outcome=outcome,
            **fields,
        )
    )
    session.commit()


def add_failover(session: Session, key: str, *, sent: bool = True) -> Message:
    """A message that failed over, its attempt rows as the worker writes them (each naming its
    provider): a 503 at ``primary`` (it created nothing), a 429 and then the accepted send at
    ``backup`` (``sent``); or only the 503, after which it is pending on ``backup``
    (``FAILOVER``, the stored reason naming the recipient, as older releases stored it)."""
    reason = f"failed over from 'primary' to 'backup': 503 for {RECIPIENT}"
    started = utcnow() - dt.timedelta(seconds=30)
    message = add(
        session,
        key,
        "sent" if sent else "pending",
        provider="backup",
        attempts=3 if sent else 1,
        last_error_code="HTTP_429" if sent else "FAILOVER",
        last_error="rate limited" if sent else reason,
        sent_at=utcnow() if sent else None,
        provider_ref="msg_backup_1" if sent else None,
        created_at=started - dt.timedelta(seconds=1),
    )
    calls = [("primary", "retryable", "HTTP_503")]
    if sent:
        calls += [("backup", "retryable", "HTTP_429"), ("backup", "delivered", None)]
    for number, (provider, outcome, code) in enumerate(calls, start=1):
        session.add(
            Attempt(
                message_id=message.id,
                number=number,
                kind="send",
                provider=provider,
                started_at=started + dt.timedelta(seconds=number),
                outcome=outcome,
                error_code=code,
                error=None if code is None else f"answer for {RECIPIENT}",
            )
        )
    session.commit()
    return message
