"""The receipts' transitions: a provider's delivery receipt recorded, and the move it makes.

- ``record_many`` (``record`` for one): receipts (``ReceiptEvent``) for the messages of their
  keys, each stored once per provider and event (a retried callback is a no-op) with what it
  did (``Effect``), in a handful of statements however many (the receiver's group commit);
- ``apply_waiting``: the sweeper applies the final receipts that arrived before their
  message's worker recorded it ``sent`` (``Effect.WAITING``).

A receipt only moves a message up ``RECEIPT_RANK`` (``sent`` < ``undelivered`` <
``delivered``), and a final one also resolves an ``unknown`` message (the provider had it), so
every order of the same receipts ends in the same status. ``record_many`` reads its messages
locked, so concurrent receipts of one message take turns. These moves are fenced on the status
alone, which is safe: no worker holds a ``sent``, ``undelivered``, ``delivered`` or
``unknown`` row, and no move out of them changes the attempt count that fences every worker.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    String,
    any_,
    bindparam,
    case,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from delivery.core.models import UTCDateTime, messages_table, receipts_table, utcnow
from delivery.core.status import OPEN, RECEIPT_RANK, Status
from delivery.observability.events import emit_moved
from delivery.transitions.fence import among, among_params, unnest

__all__ = [
    "RECEIPT_STATUSES",
    "Effect",
    "ReceiptEvent",
    "Recorded",
    "apply_waiting",
    "record",
    "record_many",
]

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
    are the message's, for the suppression list (never logged); ``lag``: seconds from the
    provider's accept to its delivery, on a move to ``delivered``."""

    message_id: int | None
    effect: Effect | None
    moved_from: Status | None = None
    channel: str | None = None
    recipient: str | None = None
    lag: float | None = None


_MESSAGE = select(
    messages_table.c.id,
    messages_table.c.key,
    messages_table.c.provider,
    messages_table.c.attempts,
    messages_table.c.status,
    messages_table.c.channel,
    messages_table.c.recipient,
    messages_table.c.message_type,
    messages_table.c.sent_at,
    messages_table.c.traceparent,  # a receipt's move is an event in the message's trace
)
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


@functools.cache
def _lock(dialect: str) -> Any:
    """The messages of a batch's keys, locked in id order (two batches never wait on each
    other in a cycle; a worker's ``take`` locks in id order too). On PostgreSQL each row also
    brings which of ``events`` it has stored already (``stored``), saving ``_seen``'s round
    trip."""
    m, r = messages_table.c, receipts_table.c
    locked = _MESSAGE.where(_one_of(m.key, "keys", dialect)).order_by(m.id).with_for_update()
    if dialect != "postgresql":
        return locked
    stored = select(r.event).where(r.message_id == m.id, _one_of(r.event, "events", dialect))
    return locked.add_columns(func.array(stored.scalar_subquery()).label("stored"))


@functools.cache
def _seen(dialect: str) -> Any:
    """Which of ``events`` the messages ``ids`` have stored already (but on PostgreSQL, where
    ``_lock`` says): found through each message's few receipts
    (``ix_delivery_receipts_message_id``), so the cost never grows with the table (through
    the provider's, a prepared plan read every receipt of it)."""
    r = receipts_table.c
    return select(r.provider, r.event).where(
        _one_of(r.message_id, "ids", dialect, BigInteger()),
        _one_of(r.event, "events", dialect),
    )


def _one_of(column: Any, name: str, dialect: str, kind: Any = None) -> Any:
    """``column`` is one of the list bound as ``name``: ``= ANY(:name)`` on PostgreSQL (one
    statement text whatever the list's length, so it is prepared once), ``IN`` elsewhere."""
    if dialect == "postgresql":
        return column == any_(bindparam(name, type_=ARRAY(kind or String())))
    return column.in_(bindparam(name, expanding=True))


def record(conn: Connection, receipt: ReceiptEvent) -> Recorded:
    """``record_many`` for one receipt."""
    return record_many(conn, [receipt])[0]


def record_many(conn: Connection, receipts: Sequence[ReceiptEvent]) -> list[Recorded]:
    """Store each of ``receipts`` for the message of its key and provider and make the moves,
    in the caller's transaction (the receiver commits it before it answers), in a handful of
    statements however many receipts: what each did, in their order.

    The messages are read locked (``FOR UPDATE``), so a concurrent receipt of the same message
    waits and then reads where this one left it: the order never decides where a message
    ends. A message's receipts apply in the order given; an event stored already, or twice
    in ``receipts``, is a duplicate (``effect`` None)."""
    dialect = conn.dialect.name
    keys, events = sorted({r.key for r in receipts}), sorted({r.event for r in receipts})
    found = conn.execute(_lock(dialect), {"keys": keys, "events": events}).all()
    rows = {row.key: row for row in found}
    if dialect == "postgresql":
        seen = {(row.provider, event) for row in found for event in row.stored}
    elif rows:
        ids = [row.id for row in found]
        found_events = conn.execute(_seen(dialect), {"ids": ids, "events": events})
        seen = {(provider, event) for provider, event in found_events}
    else:
        seen = set()
    now = utcnow()
    status = {row.id: Status(row.status) for row in rows.values()}
    results: list[Recorded] = []
    stored: list[dict[str, Any]] = []
    moves: list[_Move] = []
    for receipt in receipts:
        row = rows.get(receipt.key)
        if row is None or row.provider != receipt.provider:
            results.append(Recorded(None, None))
            continue
        if (receipt.provider, receipt.event) in seen:
            results.append(Recorded(row.id, None))
            continue
        seen.add((receipt.provider, receipt.event))
        current = status[row.id]
        effect, target = _plan(current, receipt.status)
        stored.append(_receipt_row(row.id, receipt, effect, now))
        if target is None:
            results.append(Recorded(row.id, effect, None, row.channel, row.recipient))
            continue
        status[row.id] = target
        moves.append((row, current, target, receipt.code))
        lag = _lag(row.sent_at, receipt.at or now) if target is Status.DELIVERED else None
        results.append(Recorded(row.id, effect, current, row.channel, row.recipient, lag))
    _write(conn, stored, moves, now)
    return results


#: A planned move: the message's row, the status it is planned from and to, the receipt's code.
_Move = tuple[Any, Status, Status, str | None]


def _receipt_row(
    message_id: int, receipt: ReceiptEvent, effect: Effect, now: dt.datetime
) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "provider": receipt.provider,
        "event": receipt.event,
        "status": receipt.status,
        "code": receipt.code,
        "provider_at": receipt.at,
        "received_at": now,
        "effect": effect.value,
    }


def _lag(sent_at: dt.datetime | None, at: dt.datetime) -> float | None:
    """Seconds from the provider's accept (``sent_at``) to its delivery, if both are known."""
    return None if sent_at is None else max(0.0, (at - sent_at).total_seconds())


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
    current = Status(row.status)
    if not _move_one(conn, row.id, current, to, utcnow()):
        return False
    emit_moved(row, current, to.value, "receipt", code)
    return True


def _move_one(
    conn: Connection, message_id: int, current: Status, to: Status, now: dt.datetime
) -> bool:
    """The one statement of one move, fenced on ``current``; False if it moved meanwhile."""
    statement = _MOVE_FROM_UNKNOWN if current is Status.UNKNOWN else _MOVE
    params = {"fence_id": message_id, "fence_status": current.value, "to": to.value, "at": now}
    return bool(conn.execute(statement, params).rowcount)


def _write(
    conn: Connection, stored: Sequence[dict[str, Any]], moves: Sequence[_Move], now: dt.datetime
) -> None:
    """Insert the ``stored`` receipt rows (an event stored already skipped) and make
    ``moves``, planned on rows this transaction holds locked (``_lock``), each fenced on the
    status it was planned from; then emit the moves. On PostgreSQL one statement for them
    all (``unnest``), each message from where it was to where its last move takes it;
    elsewhere a statement per row, each move in turn (a message's second move starts where
    its first left it)."""
    if conn.dialect.name == "postgresql":
        params: dict[str, Any] = {f"r_{c}": [row[c] for row in stored] for c in _RECEIPT_TYPES}
        if moves:
            ends: dict[int, tuple[Status, Status]] = {}
            for row, current, to, _ in moves:
                ends[row.id] = (ends[row.id][0] if row.id in ends else current, to)
            params |= {
                **among_params("m_ids", ends),
                "m_from": [start.value for start, _ in ends.values()],
                "m_to": [end.value for _, end in ends.values()],
                "m_at": now,
            }
            conn.execute(_write_unnest(), params)
        elif stored:
            conn.execute(_insert_unnest(), params)
    else:
        if stored:
            conn.execute(_insert_once(conn.dialect.name), stored)
        for row, current, to, _ in moves:
            _move_one(conn, row.id, current, to, now)
    for row, current, to, code in moves:
        emit_moved(row, current, to.value, "receipt", code)


def _mark(conn: Connection, receipt_id: int, effect: Effect) -> None:
    r = receipts_table.c
    conn.execute(update(receipts_table).where(r.id == receipt_id).values(effect=effect.value))


@functools.cache
def _insert_once(dialect: str) -> Any:
    """INSERT .. ON CONFLICT DO NOTHING (PostgreSQL, SQLite), built once: each receipt only
    binds its values. The conflict is (provider, event)'s unique index; on a partitioned
    outbox it holds ``message_id`` too (``delivery.runtime.partitions``), hence no target."""
    build = pg_insert if dialect == "postgresql" else sqlite_insert
    return build(receipts_table).on_conflict_do_nothing()


_RECEIPT_TYPES: dict[str, Any] = {
    "message_id": BigInteger(),
    "provider": String(),
    "event": String(),
    "status": String(),
    "code": String(),
    "provider_at": UTCDateTime(),
    "received_at": UTCDateTime(),
    "effect": String(),
}


@functools.cache
def _insert_unnest() -> Any:
    """INSERT .. SELECT FROM unnest(..) ON CONFLICT DO NOTHING."""
    rows = unnest("r", *((f"r_{c}", kind) for c, kind in _RECEIPT_TYPES.items()))
    return (
        pg_insert(receipts_table)
        .from_select(list(_RECEIPT_TYPES), select(*rows.c))
        .on_conflict_do_nothing()
    )


@functools.cache
def _write_unnest() -> Any:
    """The moves of a batch in one UPDATE, each fenced on its status as planned (out of
    ``unknown`` also clearing the lease and the lookup flag, as ``_MOVE_FROM_UNKNOWN``), with
    the batch's receipts inserted by a data-modifying CTE of the same statement."""
    m = messages_table.c
    v = unnest("v", ("m_ids", BigInteger()), ("m_from", String()), ("m_to", String()))
    from_unknown = v.c.m_from == Status.UNKNOWN.value
    return (
        update(messages_table)
        .where(m.id == v.c.m_ids, m.status == v.c.m_from, among(m.id, "m_ids"))
        .values(
            status=v.c.m_to,
            updated_at=bindparam("m_at", type_=UTCDateTime()),
            lease_expires_at=case((from_unknown, None), else_=m.lease_expires_at),
            needs_lookup=case((from_unknown, False), else_=m.needs_lookup),
        )
        .add_cte(_insert_unnest().cte("stored"))
    )
