"""Leases a live worker renews on the messages it holds, so that a dead worker's messages
come back in seconds (G8 in docs/concepts.md, "Guarantees").

A message a worker holds is ``dispatched`` (prefetched, waiting for a free slot, or a short
retry whose countdown has run out) or ``sending`` (in the provider call). Its worker renews
their leases every ``hold_lease / 3`` s to ``now + hold_lease`` (``renew_held``: one
conditional UPDATE per status, the status as its fence); a killed worker stops renewing, and
the sweeper recovers its rows ``hold_lease`` s after the last renewal, not after the relay's
``dispatch_lease`` (which only covers a task still waiting in the broker, held by nobody) or
the ``send_lease``.

A ``sending`` row is renewed only while its attempt is younger than ``send_lease`` minus
``hold_lease``: its lease never goes past ``send_lease`` after the call started, which exceeds
the provider's total timeout. So a hung call is still taken for dead at ``send_lease``, and a
live one is never taken for dead while its worker renews.

Before a worker takes it, a task waits in its broker queue, held by nobody: on each pass the
relay asks each queue's depth and renews the rows whose tasks are still queued to ``now +
dispatch_lease`` (``renew_queued``), whoever published them (the relay or the post-commit
nudge). So a task waiting behind a long backlog is never taken for lost, however long it
waits, and ``dispatch_lease`` (10 s by default) only covers the moment between the relay's
last look at the queue and the worker's first renewal: a task received in the very instant its
worker is killed comes back ``dispatch_lease`` s after that.

Like every lifeline (Oban's), this can cause a duplicate: a live worker that cannot reach the
database for ``hold_lease`` s loses its rows to the sweeper, and a send then in flight may be
made again with the same key (the provider dedupes; ``give_up`` parks it as ``unknown``).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Connection, any_, bindparam, func, or_, select, update
from sqlalchemy.dialects.postgresql import ARRAY

from delivery.core.clock import db_now
from delivery.core.models import messages_table, utcnow
from delivery.core.status import Status

__all__ = ["Renewed", "renew_held", "renew_queued"]


@dataclass(frozen=True, slots=True)
class Renewed:
    """How many ``dispatched`` and ``sending`` rows one renewal extended."""

    dispatched: int
    sending: int


@functools.cache
def _renewals(dialect: str) -> tuple[Any, Any]:
    """``renew_held``'s two UPDATEs (``dispatched`` rows, ``sending`` rows), built once per
    dialect with every value a parameter: built per renewal, SQLAlchemy's cache key for them
    cost 5% of a single-message worker's CPU.

    - The held rows: on PostgreSQL ``id = ANY(:held)``, one array parameter, so the text is
      the same for any number of held rows (an ``IN`` list of hundreds of ids was rendered,
      sent and parsed anew on every renewal: a quarter of a batch worker's CPU).
    - Of those, the rows whose lease needs this renewal and that no other transaction is
      changing right now. A lease renewed less than ``hold_lease / 3`` s ago (before
      ``:fresh``) is left as it is (a worker holding hundreds of messages in batches does not
      rewrite them all whenever one more arrives); a longer one (past ``:until``: the relay's
      ``dispatch_lease``) is shortened. A row its worker is moving (a batch taking or settling
      it, which writes the lease itself) is skipped, so a renewal never waits for, or
      deadlocks with, the worker's own transitions; the next one catches it. On PostgreSQL
      ``id = ANY(ARRAY(locking subquery))``: the subquery runs once, then the rows are updated
      by primary key (``id IN (...)`` let the planner rescan the subquery, a sequential scan
      of the table, once per held row, holding its row locks that long against the batches'
      own statements).
    """
    m = messages_table.c
    postgresql = dialect == "postgresql"
    if postgresql:
        held = m.id == any_(bindparam("held", type_=ARRAY(BigInteger())))
    else:
        held = m.id.in_(bindparam("held", expanding=True))
    stale = or_(
        m.lease_expires_at.is_(None),
        m.lease_expires_at < bindparam("fresh"),
        m.lease_expires_at > bindparam("until"),
    )
    unlocked = select(m.id).where(held, stale).with_for_update(skip_locked=True)
    if postgresql:
        chosen = m.id == any_(func.array(unlocked.scalar_subquery()))
    else:
        chosen = m.id.in_(unlocked)
    renew = update(messages_table).values(lease_expires_at=bindparam("until"))
    dispatched = renew.where(
        held, m.status == Status.DISPATCHED.value, m.next_attempt_at <= bindparam("now"), chosen
    )
    sending = renew.where(  # updated_at: when this attempt took the row
        held, m.status == Status.SENDING.value, m.updated_at > bindparam("newest"), chosen
    )
    return dispatched, sending


def _one_of(conn: Connection, ids: Any) -> Any:
    """``id`` is one of the ids ``ids`` selects (``= ANY(ARRAY(...))`` on PostgreSQL)."""
    if conn.dialect.name == "postgresql":
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
        "held": sorted(set(ids)),
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
    left as it is (as ``renew_held`` does): a queued row is rewritten every ``lease / 3`` s,
    not on every relay pass (each renewal writes a new version of the row and of every index
    entry, ``lease_expires_at`` being indexed), and still has ``lease / 3`` s or more left
    when the next pass comes (``dispatch_lease >= 3 relay_interval``).

    ``depths``: tasks waiting in each priority's queue, as the broker counts them (not the
    ones workers hold unacknowledged). Queues are first in, first out, so the tasks still in a
    queue of depth ``d`` are the ``d`` last published to it: the ``d`` rows of that priority
    ``dispatched`` most recently (``updated_at``: when the relay or the nudge claimed them;
    a short retry, due after it was parked, is not one of them). Rows a worker took are older
    than those and keep the lease their worker renews. A priority whose depth is unknown is
    left alone. The status is the fence: a row a worker moved meanwhile is not touched."""
    m = messages_table.c
    counted = {p: d for p, d in depths.items() if d}
    if not counted:
        return 0
    now = now or db_now(conn)
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
        # a row a worker is moving is skipped: it is not queued. ``= ANY(ARRAY(...))`` on
        # PostgreSQL: each subquery runs once (see ``_renewals``).
        stale = (
            select(m.id)
            .where(_one_of(conn, newest), m.status == Status.DISPATCHED.value)
            .where(m.lease_expires_at < fresh)
            .with_for_update(skip_locked=True)
        )
        chosen = _one_of(conn, stale)
        renewed += conn.execute(
            update(messages_table)
            .where(chosen, m.status == Status.DISPATCHED.value)
            .where(m.lease_expires_at < fresh)
            .values(lease_expires_at=until)
        ).rowcount
    return renewed
