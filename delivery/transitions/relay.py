"""The relay's transitions, each emitting its ``Transition`` once its UPDATE moved the row:

- ``dispatch``: the due ``pending`` rows the relay picked -> ``dispatched`` with a lease, in one
  UPDATE (the claim's);
- ``release``: rows it claimed whose publish failed -> back to ``pending``.

``dispatch`` is fenced on the status only (``pending``), with the rows locked by the relay's
pick (``FOR UPDATE SKIP LOCKED``), which is safe: a ``pending`` row is held by no worker, no
move out of ``pending`` changes its attempt count, and the only writers racing it (another
relay, a cancel, the sweeper's time-to-live) are fenced on ``pending`` too, so one of them
wins. ``release`` is fenced on the status and the attempt count each claim read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, Row, update

from delivery.core.models import messages_table
from delivery.core.status import Status
from delivery.observability.events import emit_moved
from delivery.transitions.fence import move

__all__ = ["Claimed", "dispatch", "release"]

_STATEMENTS: dict[Any, Any] = {}


class Claimed(Protocol):
    """A claimed row as the relay hands it on (``delivery.relay.claims.Claim``)."""

    @property
    def id(self) -> int: ...
    @property
    def key(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def attempts(self) -> int: ...


def dispatch(
    connection: Connection,
    *,
    shape: Any,
    chosen: Any,
    clock: Any,
    until: Any,
    params: Mapping[str, Any],
) -> list[Row[Any]]:
    """The claim: the ``pending`` rows ``chosen`` selects -> ``dispatched``, ``updated_at`` =
    ``clock``, leased until ``until``; their id, key, priority, provider and attempts. The
    statement is kept per ``shape`` (the relay's pick: built and compiled once)."""
    stmt = _STATEMENTS.get(shape)
    if stmt is None:
        m = messages_table.c
        stmt = _STATEMENTS[shape] = (
            update(messages_table)
            .where(chosen)
            .where(m.status == Status.PENDING.value)
            .values(status=Status.DISPATCHED.value, updated_at=clock, lease_expires_at=until)
            .returning(m.id, m.key, m.priority, m.provider, m.attempts, m.traceparent)
        )
    rows = connection.execute(stmt, params).all()
    for row in rows:
        emit_moved(row, Status.PENDING, Status.DISPATCHED)
    return list(rows)


def release(connection: Connection, claims: Sequence[Claimed]) -> int:
    """Put claimed rows whose publish failed back to ``pending``, each only while it is still
    as claimed (a row a worker took or parked meanwhile is left alone); how many."""
    released = 0
    for c in claims:
        if move(
            connection, c.id, c.attempts, Status.DISPATCHED, Status.PENDING, lease_expires_at=None
        ):
            released += 1
            emit_moved(c, Status.DISPATCHED, Status.PENDING, "publish_failed")
    return released
