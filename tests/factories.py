"""Outbox rows for tests that need a message in a given state without going through
``enqueue`` (ops commands, metrics, the relay)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy.orm import Session

from delivery.core.models import Attempt, Base, Message, utcnow

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
#: Every table of the outbox, for ``TRUNCATE``: read from the models, so none is left out (a
#: table that references the messages would make the TRUNCATE fail).
OUTBOX_TABLES = ", ".join(table.name for table in reversed(Base.metadata.sorted_tables))


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
