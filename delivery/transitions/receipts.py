"""The receipts' transitions: a provider's delivery receipt recorded, and the move it makes.

- ``record``: one receipt (``ReceiptEvent``) for the message of its key, stored once per
  provider and event (a retried callback is a no-op) with what it did (``Effect``);
- ``apply_waiting``: the sweeper applies the final receipts that arrived before their
  message's worker recorded it ``sent`` (``Effect.WAITING``).

A receipt only moves a message up ``RECEIPT_RANK`` (``sent`` < ``undelivered`` <
``delivered``), and a final one also resolves an ``unknown`` message (the provider had it), so
every order of the same receipts ends in the same status. These moves are fenced on the status
alone, which is safe: no worker holds a ``sent``, ``undelivered``, ``delivered`` or
``unknown`` row, and no move out of them changes the attempt count that fences every worker.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from delivery.core.models import messages_table, receipts_table, utcnow
from delivery.core.status import OPEN, RECEIPT_RANK, Status
from delivery.observability.events import emit_moved

__all__ = ["RECEIPT_STATUSES", "Effect", "ReceiptEvent", "Recorded", "apply_waiting", "record"]

#: The statuses a receipt may report: ``queued`` and ``sent`` say the provider has it (they
#: move nothing); ``delivered`` and ``undelivered`` are final.
RECEIPT_STATUSES = ("queued", "sent", "delivered", "undelivered")


class Effect(enum.StrEnum):
    MOVED = "moved"
    KEPT = "kept"
    WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class ReceiptEvent:
    """One receipt as its provider reported it, bounded (``delivery.receipts`` checks it)."""

    provider: str
    event: str
    key: str
    status: str  # one of RECEIPT_STATUSES
    code: str | None = None
    at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """What ``record`` did: ``message_id`` None when no message of that provider has the key
    (nothing stored); ``effect`` None when the event was stored already (a duplicate);
    ``moved_from``: the status the message left, when it moved."""

    message_id: int | None
    effect: Effect | None
    moved_from: Status | None = None


_MESSAGE = select(
    messages_table.c.id,
    messages_table.c.key,
    messages_table.c.provider,
    messages_table.c.attempts,
    messages_table.c.status,
)


def record(conn: Connection, receipt: ReceiptEvent) -> Recorded:
    """Store ``receipt`` for the message of its key and provider and make its move, in the
    caller's transaction (the receiver commits it before it answers)."""
    m = messages_table.c
    row = conn.execute(_MESSAGE.where(m.key == receipt.key, m.provider == receipt.provider)).first()
    if row is None:
        return Recorded(None, None)
    values = {
        "message_id": row.id,
        "provider": receipt.provider,
        "event": receipt.event,
        "status": receipt.status,
        "code": receipt.code,
        "provider_at": receipt.at,
        "received_at": utcnow(),
        "effect": Effect.KEPT.value,
    }
    stored = conn.execute(_insert_once(conn, values)).first()
    if stored is None:
        return Recorded(row.id, None)
    effect, moved_from = _move(conn, row, receipt.status, receipt.code)
    if effect is not Effect.KEPT:
        r = receipts_table.c
        conn.execute(update(receipts_table).where(r.id == stored.id).values(effect=effect.value))
    return Recorded(row.id, effect, moved_from)


def apply_waiting(conn: Connection, limit: int = 1000) -> int:
    """Apply the receipts waiting for their message to leave ``pending``, ``dispatched`` or
    ``sending``; how many moved a message. One still open keeps waiting."""
    r, m = receipts_table.c, messages_table.c
    waiting = conn.execute(
        select(r.id, r.status, r.code, r.message_id)
        .where(r.effect == Effect.WAITING.value)
        .order_by(r.id)
        .limit(limit)
    ).all()
    moved = 0
    for receipt in waiting:
        row = conn.execute(_MESSAGE.where(m.id == receipt.message_id)).first()
        if row is None:
            continue
        effect, _ = _move(conn, row, receipt.status, receipt.code)
        if effect is not Effect.WAITING:
            conn.execute(
                update(receipts_table).where(r.id == receipt.id).values(effect=effect.value)
            )
            moved += effect is Effect.MOVED
    return moved


def _insert_once(conn: Connection, values: dict[str, object]) -> Any:
    """INSERT .. ON CONFLICT (provider, event) DO NOTHING RETURNING id (PostgreSQL, SQLite)."""
    build = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    statement = build(receipts_table).values(**values)
    return statement.on_conflict_do_nothing(index_elements=["provider", "event"]).returning(
        receipts_table.c.id
    )


def _move(conn: Connection, row: Any, to_be: str, code: str | None) -> tuple[Effect, Status | None]:
    """The move a receipt saying ``to_be`` makes on ``row`` (as just read), fenced on the
    status: up ``RECEIPT_RANK``, or out of ``unknown`` for a final receipt."""
    to = Status(to_be) if to_be in ("delivered", "undelivered") else None
    current = Status(row.status)
    if to is None:
        return Effect.KEPT, None
    if current in OPEN:
        return Effect.WAITING, None
    rank = RECEIPT_RANK[to]
    lower: Sequence[Status] = [s for s, n in RECEIPT_RANK.items() if n < rank]
    if current not in (*lower, Status.UNKNOWN):
        return Effect.KEPT, None
    m = messages_table.c
    values: dict[str, object] = {"status": to.value, "updated_at": utcnow()}
    if current is Status.UNKNOWN:
        values.update(lease_expires_at=None, needs_lookup=False)
    moved = conn.execute(
        update(messages_table).where(m.id == row.id, m.status == current.value).values(**values)
    ).rowcount
    if not moved:  # moved meanwhile: the next receipt or the sweeper sees where it went
        return Effect.KEPT, None
    emit_moved(row, current.value, to.value, "receipt", code)
    return Effect.MOVED, current
