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
import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, select, update
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
    ``moved_from``: the status the message left, when it moved. ``channel`` and ``recipient``
    are the message's, for the suppression list (never logged)."""

    message_id: int | None
    effect: Effect | None
    moved_from: Status | None = None
    channel: str | None = None
    recipient: str | None = None


_MESSAGE = select(
    messages_table.c.id,
    messages_table.c.key,
    messages_table.c.provider,
    messages_table.c.attempts,
    messages_table.c.status,
    messages_table.c.channel,
    messages_table.c.recipient,
    messages_table.c.message_type,
)
_TRIES = 3  # plans of one receipt's move, when concurrent receipts move its message first
_MOVE = (
    update(messages_table)
    .where(
        messages_table.c.id == bindparam("fence_id"),
        messages_table.c.status == bindparam("fence_status"),
    )
    .values(status=bindparam("to"), updated_at=bindparam("at"))
)
#: Out of ``unknown``: no lease left, and no lookup needed any more (the receipt answered it).
_MOVE_FROM_UNKNOWN = _MOVE.values(lease_expires_at=None, needs_lookup=False)
_BY_KEY = _MESSAGE.where(
    messages_table.c.key == bindparam("key"), messages_table.c.provider == bindparam("provider")
)


def record(conn: Connection, receipt: ReceiptEvent) -> Recorded:
    """Store ``receipt`` for the message of its key and provider and make its move, in the
    caller's transaction (the receiver commits it before it answers)."""
    row = conn.execute(_BY_KEY, {"key": receipt.key, "provider": receipt.provider}).first()
    if row is None:
        return Recorded(None, None)
    effect, target = _plan(Status(row.status), receipt.status)
    values = {
        "message_id": row.id,
        "provider": receipt.provider,
        "event": receipt.event,
        "status": receipt.status,
        "code": receipt.code,
        "provider_at": receipt.at,
        "received_at": utcnow(),
        "effect": effect.value,
    }
    stored = conn.execute(_insert_once(conn.dialect.name), values).first()
    if stored is None:
        return Recorded(row.id, None)
    first, to = effect, (row.channel, row.recipient)
    moved_from: Status | None = None
    # A concurrent receipt of the same message may move it between the read and the fenced
    # UPDATE: read it again and plan again, so that the order never decides where it ends.
    for _ in range(_TRIES):
        if target is None:
            break
        if _move(conn, row, target, receipt.code):
            moved_from = Status(row.status)
            break
        row = conn.execute(_MESSAGE.where(messages_table.c.id == row.id)).one()
        effect, target = _plan(Status(row.status), receipt.status)
    else:
        effect = Effect.KEPT
    if effect is not first:
        _mark(conn, stored.id, effect)
    return Recorded(row.id, effect, moved_from, *to)


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
        effect, target = _plan(Status(row.status), receipt.status)
        if effect is Effect.WAITING:
            continue
        if target is not None and not _move(conn, row, target, receipt.code):
            continue  # moved meanwhile: looked at again on the next pass
        _mark(conn, receipt.id, effect)
        moved += effect is Effect.MOVED
    return moved


def _plan(current: Status, to_be: str) -> tuple[Effect, Status | None]:
    """What a receipt saying ``to_be`` does to a message in ``current``: the effect, and the
    status it moves the message to (None: no move): up ``RECEIPT_RANK``, or out of
    ``unknown`` for a final receipt; a final receipt for an open message waits."""
    to = Status(to_be) if to_be in ("delivered", "undelivered") else None
    if to is None:
        return Effect.KEPT, None
    if current in OPEN:
        return Effect.WAITING, None
    lower = [s for s, n in RECEIPT_RANK.items() if n < RECEIPT_RANK[to]]
    if current not in (*lower, Status.UNKNOWN):
        return Effect.KEPT, None
    return Effect.MOVED, to


def _move(conn: Connection, row: Any, to: Status, code: str | None) -> bool:
    """``row`` (as just read) -> ``to``, fenced on its status (see the module docstring);
    emits the transition. False if it moved meanwhile."""
    out_of_unknown = row.status == Status.UNKNOWN
    statement = _MOVE_FROM_UNKNOWN if out_of_unknown else _MOVE
    params = {"fence_id": row.id, "fence_status": row.status, "to": to.value, "at": utcnow()}
    if not conn.execute(statement, params).rowcount:
        return False
    emit_moved(row, row.status, to.value, "receipt", code)
    return True


def _mark(conn: Connection, receipt_id: int, effect: Effect) -> None:
    r = receipts_table.c
    conn.execute(update(receipts_table).where(r.id == receipt_id).values(effect=effect.value))


@functools.cache
def _insert_once(dialect: str) -> Any:
    """INSERT .. ON CONFLICT (provider, event) DO NOTHING RETURNING id (PostgreSQL, SQLite),
    built once: each receipt only binds its values."""
    build = pg_insert if dialect == "postgresql" else sqlite_insert
    return (
        build(receipts_table)
        .on_conflict_do_nothing(index_elements=["provider", "event"])
        .returning(receipts_table.c.id)
    )
