"""The sweeper's transitions (Oban's "lifeline"): rows whose lease or time-to-live passed,
each emitting its ``Transition`` once its UPDATE moved the row.

- ``expire``: ``pending`` or ``dispatched`` past its time-to-live -> ``expired``;
- ``requeue``: ``dispatched`` past its lease (its task was lost) -> ``pending``, no attempt
  spent;
- ``recover``: one ``sending`` row past its lease (its worker was lost) -> its policy's status,
  with the attempt row of that send (outcome unknown, ``LEASE_EXPIRED``).

``recover`` is fenced like every worker move (status and attempt count, plus "its lease has
passed": a renewal since then wins). ``expire`` and ``requeue`` move every row that matches
in one statement, fenced on the status and the passed lease or time-to-live but not on an
attempt count, which is safe: a row in ``pending`` is held by nobody, and a ``dispatched``
row past its lease by no live worker (a live worker renews it); neither move changes the
attempt count, and the only move that spends one (the take, ``dispatched`` -> ``sending``)
is fenced on the status, so a late worker finds the row gone or takes it exactly once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, update

from delivery.core.models import messages_table
from delivery.core.status import Status
from delivery.observability.events import emit_moved
from delivery.transitions.attempts import LEASE_EXPIRED, log_lost
from delivery.transitions.fence import move_where

__all__ = ["EXPIRED", "LEASE_EXPIRED", "expire", "recover", "requeue"]

EXPIRED = "EXPIRED"
"""The code of a message whose time-to-live passed before it could be sent."""
_MOVED = (
    messages_table.c.id,
    messages_table.c.key,
    messages_table.c.provider,
    messages_table.c.attempts,
    messages_table.c.traceparent,  # its move is an event in the message's trace
)


def expire(conn: Connection, old: Status, now: dt.datetime) -> int:
    """Every ``old`` row (``pending`` or ``dispatched``) past its time-to-live at ``now`` ->
    ``expired``; how many."""
    moved = _move_all(
        conn,
        old,
        Status.EXPIRED,
        messages_table.c.expires_at < now,
        dict(
            lease_expires_at=None,
            updated_at=now,
            last_error_code=EXPIRED,
            last_error="time-to-live passed before it could be sent",
        ),
    )
    for row in moved:
        emit_moved(row, old, Status.EXPIRED, "expired", EXPIRED)
    return len(moved)


def requeue(conn: Connection, now: dt.datetime) -> int:
    """Every ``dispatched`` row whose lease passed before ``now`` -> ``pending``; how many."""
    moved = _move_all(
        conn,
        Status.DISPATCHED,
        Status.PENDING,
        messages_table.c.lease_expires_at < now,
        dict(lease_expires_at=None, updated_at=now),
    )
    for row in moved:
        emit_moved(row, Status.DISPATCHED, Status.PENDING, "lease_expired")
    return len(moved)


def recover(
    conn: Connection, row: Any, to: Status, now: dt.datetime, values: Mapping[str, object]
) -> bool:
    """One ``sending`` row (as read: id, key, provider, attempts) whose worker was lost ->
    ``to``, only while it is still this attempt's and its lease passed before ``now``, with
    the attempt row of that send; False if it moved or was renewed meanwhile."""
    fence = (row.id, row.attempts, Status.SENDING)
    reason = str(values.get("last_error", ""))
    # the lost send may have taken effect: pinned to its provider (no failover)
    values = {**values, "last_error_code": LEASE_EXPIRED, "pinned": True}
    if not move_where(conn, fence, to, messages_table.c.lease_expires_at < now, values):
        return False
    log_lost(conn, row, now, reason)
    emit_moved(row, Status.SENDING, to, "unknown", LEASE_EXPIRED)
    return True


def _move_all(
    conn: Connection,
    expected: Status,
    to: Status,
    when: ColumnElement[bool],
    values: Mapping[str, object],
) -> list[Row[Any]]:
    """Every row in ``expected`` for which ``when`` holds -> ``to`` (the status and ``when``
    are the fence); the moved rows' id, key, provider and attempts."""
    return list(
        conn.execute(
            update(messages_table)
            .where(messages_table.c.status == expected.value, when)
            .values(**{"status": to.value, **values})
            .returning(*_MOVED)
        ).all()
    )
