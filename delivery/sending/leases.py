"""Leases a live worker renews on the messages it holds (``renew_held``: ``dispatched`` and
``sending`` rows, to ``hold_lease``) and the relay on the rows whose tasks still wait in a
broker queue (``renew_queued``, to ``dispatch_lease``), so that a dead worker's messages come
back in seconds (G8; docs/deployment.md, "A killed worker costs seconds" and "Back-pressure,
and tasks waiting in a queue"). A ``sending`` row is renewed only up to ``send_lease`` after
its attempt started, which exceeds the provider's total timeout: a hung call is still taken
for dead then.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, any_, bindparam, func, or_, select, update

from delivery.core.clock import db_now
from delivery.core.models import messages_table, utcnow
from delivery.core.status import Status
from delivery.transitions.fence import among, among_params

__all__ = ["Renewed", "renew_held", "renew_queued"]


@dataclass(frozen=True, slots=True)
class Renewed:
    """How many ``dispatched`` and ``sending`` rows one renewal extended."""

    dispatched: int
    sending: int


@functools.cache
def _renewals(dialect: str) -> tuple[Any, Any]:
    """``renew_held``'s two UPDATEs (``dispatched`` rows, ``sending`` rows), built once per
    dialect with every value a parameter, the held rows one array parameter on PostgreSQL
    (the same text for any number of them).

    Of the held rows, only those whose lease needs this renewal: one renewed less than
    ``hold_lease / 3`` s ago (before ``:fresh``) is left as it is (a worker holding hundreds
    of messages does not rewrite them all whenever one more arrives), a longer one (past
    ``:until``: the relay's ``dispatch_lease``) is shortened. A row another transaction is
    moving (a batch taking or settling it, which writes the lease itself) is skipped, so a
    renewal never waits for, or deadlocks with, the worker's own transitions.
    """
    m = messages_table.c
    if dialect == "postgresql":
        held = among(m.id, "held")
    else:
        held = m.id.in_(bindparam("held", expanding=True))
    stale = or_(
        m.lease_expires_at.is_(None),
        m.lease_expires_at < bindparam("fresh"),
        m.lease_expires_at > bindparam("until"),
    )
    chosen = _one_of(dialect, select(m.id).where(held, stale).with_for_update(skip_locked=True))
    renew = update(messages_table).values(lease_expires_at=bindparam("until"))
    dispatched = renew.where(
        held, m.status == Status.DISPATCHED.value, m.next_attempt_at <= bindparam("now"), chosen
    )
    sending = renew.where(  # updated_at: when this attempt took the row
        held, m.status == Status.SENDING.value, m.updated_at > bindparam("newest"), chosen
    )
    return dispatched, sending


def _one_of(dialect: str, ids: Any) -> Any:
    """``id`` is one of the ids ``ids`` selects. On PostgreSQL ``= ANY(ARRAY(...))``: the
    subquery runs once, then the rows are updated by primary key (under ``IN`` the planner
    may rescan it once per row, holding its row locks that long)."""
    if dialect == "postgresql":
        return messages_table.c.id == any_(func.array(ids.scalar_subquery()))
    return messages_table.c.id.in_(ids.scalar_subquery())


def renew_held(
    conn: Connection,
    ids: Collection[int],
    *,
    hold_lease: float,
    send_lease: float,
    now: dt.datetime | None = None,
) -> Renewed:
    """Set the lease of the held rows ``ids`` to ``now + hold_lease``: ``dispatched`` ones
    always (a short retry keeps its own, later lease until it is due), ``sending`` ones only
    while their attempt started less than ``send_lease - hold_lease`` ago. Rows in any other
    status are left alone (the fence), so a late renewal never revives a settled message."""
    if not ids:
        return Renewed(0, 0)
    now = now or utcnow()
    dispatched_rows, sending_rows = _renewals(conn.dialect.name)
    params = {
        **among_params("held", sorted(set(ids))),
        "now": now,
        "until": now + dt.timedelta(seconds=hold_lease),
        "fresh": now + dt.timedelta(seconds=hold_lease * 2.0 / 3.0),
        "newest": now - dt.timedelta(seconds=max(send_lease - hold_lease, 0.0)),
    }
    dispatched = conn.execute(dispatched_rows, params).rowcount
    sending = conn.execute(sending_rows, params).rowcount
    return Renewed(dispatched, sending)


def renew_queued(
    conn: Connection,
    depths: Mapping[str, int | None],
    *,
    lease: float,
    now: dt.datetime | None = None,
) -> int:
    """Renew the rows whose tasks still wait in a broker queue to ``now + lease`` (never
    shorter than they have); return how many. A lease with more than ``2/3 lease`` left is
    left as it is (as ``renew_held`` does): each renewal writes a new version of the row and
    of its indexed ``lease_expires_at``.

    ``depths``: tasks waiting in each priority's queue, as the broker counts them. Queues are
    first in, first out, so the rows still queued in a queue of depth ``d`` are the ``d`` of
    that priority ``dispatched`` most recently (``updated_at``; a short retry, due after it
    was parked, is not one of them). A priority whose depth is unknown is left alone. The
    status is the fence: a row a worker moved meanwhile is not touched."""
    m = messages_table.c
    counted = {p: d for p, d in depths.items() if d}
    if not counted:
        return 0
    now, dialect = now or db_now(conn), conn.dialect.name
    until = now + dt.timedelta(seconds=lease)
    fresh = now + dt.timedelta(seconds=lease * 2.0 / 3.0)
    renewed = 0
    for priority, depth in counted.items():
        newest = (
            select(m.id)
            .where(m.status == Status.DISPATCHED.value, m.priority == priority)
            .where(m.next_attempt_at <= m.updated_at)
            .order_by(m.updated_at.desc(), m.id.desc())
            .limit(depth)
        )
        # Of those, only the rows this pass renews are locked (a lock writes the row too), and
        # a row a worker is moving is skipped: it is not queued.
        stale = (
            select(m.id)
            .where(_one_of(dialect, newest), m.status == Status.DISPATCHED.value)
            .where(m.lease_expires_at < fresh)
            .with_for_update(skip_locked=True)
        )
        chosen = _one_of(dialect, stale)
        renewed += conn.execute(
            update(messages_table)
            .where(chosen, m.status == Status.DISPATCHED.value)
            .where(m.lease_expires_at < fresh)
            .values(lease_expires_at=until)
        ).rowcount
    return renewed
