"""The sweeper's primitives (Oban's "lifeline"): the conditional UPDATEs that recover rows
whose lease or time-to-live passed, and the attempt row of a send whose worker was lost.

- ``move_all``: one statement for a batch: every row in the expected status that matches a
  condition (a lease or a time-to-live passed) moves, the status as its fence.
- ``move_lost``: ``transitions.move_where`` for one ``sending`` row whose lease passed, fenced
  on its status and attempt count like every worker transition.
- ``log_lost``: the attempt row of that send (outcome unknown, ``LEASE_EXPIRED``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, insert, update

from delivery.pipeline.models import attempts_table, messages_table
from delivery.pipeline.status import Status
from delivery.pipeline.transitions import move_where

__all__ = ["LEASE_EXPIRED", "MOVED", "log_lost", "move_all", "move_lost"]

LEASE_EXPIRED = "LEASE_EXPIRED"
"""The code of an attempt whose worker was lost: its lease passed during the send."""


def move_lost(
    conn: Connection,
    message_id: int,
    seen_attempts: int,
    to: Status,
    *,
    now: dt.datetime,
    values: Mapping[str, object],
) -> bool:
    """The sweeper's ``move`` of a ``sending`` row whose worker was lost: only while it is
    still this attempt's and its lease passed before ``now`` (a renewal since then wins)."""
    when = messages_table.c.lease_expires_at < now
    return move_where(conn, (message_id, seen_attempts, Status.SENDING), to, when, values)


#: What ``move_all`` returns of each row it moved (for the transition log).
MOVED = (
    messages_table.c.id,
    messages_table.c.key,
    messages_table.c.provider,
    messages_table.c.attempts,
)


def move_all(
    conn: Connection,
    expected: Status,
    to: Status,
    when: ColumnElement[bool],
    **values: object,
) -> list[Row[Any]]:
    """The conditional UPDATE of a batch: every row in ``expected`` for which ``when`` holds
    moves to ``to`` (the status is the fence: a row another process moved meanwhile is left
    alone). Returns ``MOVED`` of each row moved."""
    return list(
        conn.execute(
            update(messages_table)
            .where(messages_table.c.status == expected.value, when)
            .values(**{"status": to.value, **values})
            .returning(*MOVED)
        ).all()
    )


def log_lost(conn: Connection, message_id: int, number: int, now: dt.datetime, reason: str) -> None:
    """The attempt row of a send whose worker was lost (its lease passed): outcome unknown."""
    conn.execute(
        insert(attempts_table).values(
            message_id=message_id,
            number=number,
            kind="send",
            started_at=now,
            outcome="unknown",
            error_code=LEASE_EXPIRED,
            error=reason,
        )
    )
