"""The relay: claim due ``pending`` rows and hand them to a publisher (guarantee G1).

``claim`` marks a batch ``dispatched`` with a lease in one statement (``FOR UPDATE SKIP
LOCKED`` on PostgreSQL; SQLite serialises writers), so two relays never claim the same row.
The rows are committed as ``dispatched`` *before* they are published: a task never arrives
for a row it cannot take. A row whose task is lost (broker flushed, publish failed) is
returned to ``pending`` by the sweeper when its lease expires.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    and_,
    any_,
    func,
    literal,
    select,
    update,
)

from delivery.config.settings import PRIORITIES
from delivery.observability.events import Transition, emit
from delivery.pipeline.clock import db_now
from delivery.pipeline.models import messages_table, utcnow
from delivery.pipeline.status import Status

__all__ = ["Claim", "Publisher", "claim", "relay_once", "release"]

log = logging.getLogger("delivery.relay")


class Claim(NamedTuple):
    """What a deliver task carries: the message id and its key. Never recipient or body."""

    id: int
    key: str
    priority: str = "normal"  # picks the queue (see the message type), not part of the task
    provider: str = ""  # this and attempts: for the transition log, not part of the task
    attempts: int = 0


#: Publishes claimed rows; what it returns is its own (``tasks.deliver.publish``: tasks per queue).
Publisher = Callable[[Sequence[Claim]], object]


def _due(
    limit: int,
    ids: Sequence[int] | None,
    now: dt.datetime,
    priorities: Sequence[str] | None = None,
) -> Select[tuple[int]]:
    """Ids of due pending rows (of ``priorities``, or any) that no other transaction holds,
    oldest due first."""
    # The status is rendered as a literal, so that every plan (a prepared statement's generic
    # plan too) can prove the partial index ix_delivery_messages_due applies.
    pending = literal(Status.PENDING.value, literal_execute=True)
    due = and_(messages_table.c.status == pending, messages_table.c.next_attempt_at <= now)
    if ids is not None:
        due = and_(due, messages_table.c.id.in_(ids))
    if priorities is not None:
        due = and_(due, messages_table.c.priority.in_(priorities))
    return (
        select(messages_table.c.id)
        .where(due)
        .order_by(messages_table.c.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


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
    what is due and starts the lease."""
    now = now or db_now(connection)
    picked = _due(limit, ids, now, priorities).scalar_subquery()
    if connection.dialect.name == "postgresql":
        # ``= ANY(ARRAY(...))``: the picked ids are read first, then updated by primary key,
        # so a batch costs the same however many rows are pending (``IN (...)`` plans a hash
        # join over every pending row).
        chosen = messages_table.c.id == any_(func.array(picked))
    else:
        chosen = messages_table.c.id.in_(picked)
    stmt = (
        update(messages_table)
        .where(chosen)
        .where(messages_table.c.status == Status.PENDING.value)
        .values(
            status=Status.DISPATCHED.value,
            updated_at=now,
            lease_expires_at=now + dt.timedelta(seconds=lease),
        )
        .returning(
            messages_table.c.id,
            messages_table.c.key,
            messages_table.c.priority,
            messages_table.c.provider,
            messages_table.c.attempts,
        )
    )
    return [Claim(*row) for row in connection.execute(stmt)]


def release(connection: Connection, claims: Sequence[Claim]) -> int:
    """Put claimed rows whose publish failed back to ``pending`` (a no-op for rows a worker
    already took)."""
    stmt = (
        update(messages_table)
        .where(messages_table.c.id.in_([c.id for c in claims]))
        .where(messages_table.c.status == Status.DISPATCHED.value)
        .values(status=Status.PENDING.value, lease_expires_at=None, updated_at=utcnow())
    )
    return connection.execute(stmt).rowcount


def _log(claims: Sequence[Claim], old: Status, new: Status, outcome: str | None = None) -> None:
    for c in claims:
        emit(Transition(c.id, c.key, c.provider, old, new, c.attempts, outcome))


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
    due. ``rooms`` (back-pressure, ``delivery.pipeline.backpressure``) caps how many rows of
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
    engine, publish, batch, lease, ids, now = (
        one.engine,
        one.publish,
        one.batch,
        one.lease,
        one.ids,
        one.now,
    )
    total = 0
    for _ in range(one.max_batches):
        limit = batch if room is None else min(batch, room - total)
        if limit <= 0:
            break
        with engine.begin() as connection:
            claims = claim(
                connection, limit=limit, lease=lease, ids=ids, now=now, priorities=priorities
            )
            # Under READ COMMITTED a claim can come back short, even empty, when the rows it
            # picked were claimed by another relay meanwhile: stop only when no due row is
            # left that nobody holds.
            left = (
                bool(claims)
                or connection.execute(_due(1, ids, now or db_now(connection), priorities)).first()
                is not None
            )
        if not left:
            break
        if not claims:
            continue
        _log(claims, Status.PENDING, Status.DISPATCHED)
        try:
            publish(claims)
        except Exception:
            with engine.begin() as connection:
                release(connection, claims)
            _log(claims, Status.DISPATCHED, Status.PENDING, "publish_failed")
            raise
        total += len(claims)
    if total:
        log.debug("relay published %d messages", total)
    return total
