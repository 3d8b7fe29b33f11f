"""The relay: claim due ``pending`` rows and hand them to a publisher (guarantee G1).

``claim`` marks a batch ``dispatched`` with a lease (its transition:
``delivery.transitions.relay``): on PostgreSQL it picks the due rows ``FOR UPDATE SKIP
LOCKED`` and updates them, in one transaction; on SQLite, which serialises writers, in one
statement. Two relays never claim the same row.
The rows are committed as ``dispatched`` *before* they are published: a task never arrives
for a row it cannot take. A row whose task is lost (broker flushed, publish failed) is
returned to ``pending`` by the sweeper when its lease expires.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    Interval,
    Select,
    and_,
    bindparam,
    func,
    literal,
    select,
)

from delivery.config.settings import PRIORITIES
from delivery.core.models import UTCDateTime, messages_table, utcnow
from delivery.core.status import Status
from delivery.transitions.fence import among, among_params
from delivery.transitions.relay import dispatch, release

__all__ = ["Claim", "Publisher", "claim", "relay_once"]

log = logging.getLogger("delivery.relay")


class Claim(NamedTuple):
    """What a deliver task carries: the message id and its key. Never recipient or body."""

    id: int
    key: str
    priority: str = "normal"  # picks the queue (see the message type), not part of the task
    provider: str = ""  # this and attempts: for the transition log, not part of the task
    attempts: int = 0
    traceparent: str | None = None  # the message's trace (its publish span's parent or link)


#: Publishes claimed rows; what it returns is its own (``delivery.worker.publish.publish``:
#: tasks per queue).
Publisher = Callable[[Sequence[Claim]], object]


def _any_due(
    connection: Connection,
    ids: Sequence[int] | None,
    now: dt.datetime | None,
    priorities: Sequence[str] | None,
) -> bool:
    """Whether a due pending row (of ``ids``, of ``priorities``) is left that nobody holds."""
    now = _now(connection, now)
    stmt = _due_statement(ids is not None, priorities is not None, now=now is not None)
    params = {"due_limit": 1, "due_ids": ids, "due_priorities": priorities, "due_now": now}
    return connection.execute(stmt, params).first() is not None


def _now(connection: Connection, now: dt.datetime | None) -> dt.datetime | None:
    """``now`` as given; else None on PostgreSQL (the statement reads its own clock) and this
    host's time on SQLite (one host, whose clock is the database's)."""
    if now is None and connection.dialect.name != "postgresql":
        return utcnow()
    return now


@functools.cache
def _due_statement(by_ids: bool, by_priority: bool, *, now: bool) -> Select[int]:
    """The ids of due pending rows that no other transaction holds, oldest due first, with
    bound parameters (``due_limit``, ``due_ids``, ``due_priorities``, and ``due_now`` when
    ``now``; else the statement's own clock, PostgreSQL's ``statement_timestamp()``): one
    object per shape, so that SQLAlchemy builds and compiles it once."""
    m = messages_table.c
    # The status is rendered as a literal, so that every plan (a prepared statement's generic
    # plan too) can prove the partial index ix_delivery_messages_due applies.
    pending = literal(Status.PENDING.value, literal_execute=True)
    due = and_(m.status == pending, m.next_attempt_at <= _clock(now))
    if by_ids:
        due = and_(due, m.id.in_(bindparam("due_ids", expanding=True)))
    if by_priority:
        due = and_(due, m.priority.in_(bindparam("due_priorities", expanding=True)))
    return (
        select(m.id)
        .where(due)
        .order_by(m.next_attempt_at)
        .limit(bindparam("due_limit", type_=Integer()))
        .with_for_update(skip_locked=True)
    )


def _clock(given: bool) -> Any:
    """The claim's "now": the bound ``due_now`` when the caller gave one, else the statement's
    own clock."""
    return bindparam("due_now", type_=UTCDateTime()) if given else _STATEMENT_CLOCK


#: PostgreSQL's clock as the claim reads it: stable within the statement (so the due index
#: applies), the database's (one clock for every host, as ``db_now``), no round trip.
_STATEMENT_CLOCK = func.statement_timestamp(type_=UTCDateTime())


def claim(
    connection: Connection,
    *,
    limit: int,
    lease: float,
    ids: Sequence[int] | None = None,
    now: dt.datetime | None = None,
    priorities: Sequence[str] | None = None,
) -> list[Claim]:
    """Mark up to ``limit`` due pending rows (optionally only ``ids``, only of
    ``priorities``) dispatched; return them. ``now`` (default: the database's clock) decides
    what is due and starts the lease. Run it in a transaction: on PostgreSQL it picks the rows
    (locking them, skipping rows another relay holds), then updates them."""
    dialect = connection.dialect.name
    now = _now(connection, now)
    lease_for = dt.timedelta(seconds=lease)
    params: dict[str, Any] = {
        "due_limit": limit,
        "due_ids": ids,
        "due_priorities": priorities,
        "due_now": now,
        "lease_for": lease_for,
        "lease_until": None if now is None else now + lease_for,
    }
    if dialect == "postgresql":
        # Two statements: the UPDATE names the picked ids (``among``), so that on an outbox
        # partitioned by day it is planned for their days alone. One UPDATE holding the
        # pick as a subquery was planned for every day at every claim (8 ms at 40 days,
        # against 0.5 ms on a new outbox). Outside a transaction it is still right (the
        # UPDATE is fenced on ``pending``), but two relays may then pick the same rows.
        due = _due_statement(ids is not None, priorities is not None, now=now is not None)
        picked = list(connection.scalars(due, params))
        if not picked:
            return []
        params |= among_params("picked", picked)
    parts = _claim_statement(dialect, ids is not None, priorities is not None, now is not None)
    rows = dispatch(connection, params=params, **parts)
    return [Claim(r.id, r.key, r.priority, r.provider, r.attempts, r.traceparent) for r in rows]


@functools.cache
def _claim_statement(dialect: str, by_ids: bool, by_priority: bool, now: bool) -> dict[str, Any]:
    """What ``claim``'s UPDATE (``transitions.relay.dispatch``) is made of, one object per
    shape (see ``_due_statement``): on PostgreSQL the rows ``claim`` picked, by primary key;
    on SQLite (one writer at a time) the pick itself, as a subquery."""
    m = messages_table.c
    clock = _clock(now)
    chosen: Any
    until: Any
    if dialect == "postgresql":
        chosen = among(m.id, "picked")
        until = clock + bindparam("lease_for", type_=Interval())
    else:  # SQLite: the lease's end bound as computed, since it stores what it is given
        chosen = m.id.in_(_due_statement(by_ids, by_priority, now=now).scalar_subquery())
        until = bindparam("lease_until", type_=UTCDateTime())
    shape = (dialect, by_ids, by_priority, now)
    return dict(shape=shape, chosen=chosen, clock=clock, until=until)


def relay_once(
    engine: Engine,
    publish: Publisher,
    *,
    batch: int,
    lease: float,
    ids: Sequence[int] | None = None,
    max_batches: int = 100,
    now: dt.datetime | None = None,
    rooms: Mapping[str, int | None] | None = None,
) -> int:
    """Claim and publish due rows in batches until none are left; return how many.

    Each batch is claimed and committed in its own transaction, then published. ``now``
    (default: the database's clock at each batch, one clock for every host) decides what is
    due. ``rooms`` (back-pressure, ``delivery.relay.backpressure``) caps how many rows of
    each priority this pass may publish; a priority it does not name, or names with ``None``,
    is not capped.
    """
    one = _Pass(engine, publish, batch, lease, ids, max_batches, now)
    capped = {p: r for p, r in (rooms or {}).items() if r is not None}
    if not capped or min(capped.values()) >= batch * max_batches:
        return _relay_group(one, None, None)
    total = 0
    for priority in PRIORITIES:  # each priority on its own: a full bulk queue holds back bulk
        room = capped.get(priority)
        if room is None or room > 0:
            total += _relay_group(one, [priority], room)
    return total


@dataclass(frozen=True, slots=True)
class _Pass:
    """One relay pass's arguments, as ``relay_once`` was given them."""

    engine: Engine
    publish: Publisher
    batch: int
    lease: float
    ids: Sequence[int] | None
    max_batches: int
    now: dt.datetime | None


def _relay_group(one: _Pass, priorities: Sequence[str] | None, room: int | None) -> int:
    """``relay_once`` for the rows of ``priorities`` (``None``: all), ``room`` at most."""
    engine, batch = one.engine, one.batch
    total = 0
    for _ in range(one.max_batches):
        limit = batch if room is None else min(batch, room - total)
        if limit <= 0:
            break
        # The claim is committed before its rows are published (the nudge runs this inside
        # the app's commit()).
        with engine.begin() as connection:
            claims = claim(
                connection,
                limit=limit,
                lease=one.lease,
                ids=one.ids,
                now=one.now,
                priorities=priorities,
            )
            # Under READ COMMITTED a claim can come back short, even empty, when the rows it
            # picked were claimed by another relay meanwhile: stop only when no due row is
            # left that nobody holds.
            left = bool(claims) or _any_due(connection, one.ids, one.now, priorities)
        if not left:
            break
        if not claims:
            continue
        try:
            one.publish(claims)
        except Exception:
            with engine.begin() as connection:
                release(connection, claims)
            raise
        total += len(claims)
    if total:
        log.debug("relay published %d messages", total)
    return total
