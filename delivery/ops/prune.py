"""Prune: delete final messages with their attempts and receipts, never an open one.

``prunable`` counts what ``prune_batch`` would delete; call ``prune_batch`` until it deletes
nothing, committing after each batch (``delivery prune`` does).

On a partitioned outbox (PostgreSQL: ``delivery.runtime.partitions``) the same messages go,
but by whole days: ``days_cutoff`` rounds the cutoff down to midnight UTC, and ``drop_days``
drops each day before it whose every message ``prune_batch`` would delete (one catalog change,
and the space returned at once). A day that still holds a message ``prune`` keeps (open, or
changed since the cutoff) is kept and reported; ``prune_batch`` then deletes its prunable
rows one by one, as on any outbox.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, Engine, and_, delete, func, select
from sqlalchemy.orm import Session

from delivery.core.models import Attempt, Message, Receipt
from delivery.core.status import FINAL, Status
from delivery.runtime import partitions
from delivery.runtime.partitions import Dropped

__all__ = ["Dropped", "PruneBatch", "days_cutoff", "drop_days", "prunable", "prune_batch"]

_FINAL = tuple(sorted(status.value for status in FINAL))
_NOT_FINAL = tuple(sorted(status.value for status in Status if status not in FINAL))


@dataclass(frozen=True, slots=True)
class PruneBatch:
    """One ``prune_batch``: how many messages and attempt rows it deleted."""

    messages: int
    attempts: int


def _prunable(cutoff: dt.datetime) -> ColumnElement[bool]:
    return and_(Message.status.in_(_FINAL), Message.updated_at < cutoff)


def prunable(session: Session, cutoff: dt.datetime) -> int:
    """How many final messages were last changed before ``cutoff`` (what ``prune`` deletes)."""
    return int(session.scalar(select(func.count()).where(_prunable(cutoff))) or 0)


def prune_batch(session: Session, cutoff: dt.datetime, *, limit: int = 1000) -> PruneBatch:
    """Delete up to ``limit`` final messages last changed before ``cutoff``, with their
    attempts and receipts. Open messages (pending, dispatched, sending) are never touched.

    The rows are locked first (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), so a concurrent
    redrive either happens before (the row is no longer final and is kept) or finds it gone.
    Call it until it deletes nothing, committing after each batch.
    """
    picked = (
        select(Message.id)
        .where(_prunable(cutoff))
        .order_by(Message.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    ids = list(session.scalars(picked))
    if not ids:
        return PruneBatch(0, 0)
    session.execute(
        delete(Receipt)
        .where(Receipt.message_id.in_(ids))
        .execution_options(synchronize_session=False)
    )
    attempts = session.execute(
        delete(Attempt)
        .where(Attempt.message_id.in_(ids))
        .execution_options(synchronize_session=False)
    )
    messages = session.execute(
        delete(Message)
        .where(Message.id.in_(ids), _prunable(cutoff))
        .execution_options(synchronize_session=False)
    )
    return PruneBatch(
        cast(CursorResult[Any], messages).rowcount, cast(CursorResult[Any], attempts).rowcount
    )


def days_cutoff(session: Session, cutoff: dt.datetime) -> dt.datetime:
    """The cutoff ``prune`` uses: on a partitioned outbox rounded down to midnight UTC (it
    removes whole days), else ``cutoff`` itself."""
    if not partitions.is_partitioned(session.connection()):
        return cutoff
    return cutoff.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def drop_days(session: Session, cutoff: dt.datetime, *, dry_run: bool = False) -> list[Dropped]:
    """On a partitioned outbox, each day that ends by ``cutoff`` (``days_cutoff``'s) dropped
    whole if ``prune_batch`` would delete every message in it, else kept (``Dropped.kept``
    says why); nothing is dropped with ``dry_run``. Each day is its own transaction, outside
    ``session``'s (which this ends). Empty on any other outbox."""
    if not partitions.is_partitioned(session.connection()):
        return []
    days = [day for day in partitions.listing(session.connection()) if day.ends <= cutoff]
    engine = session.get_bind()
    assert isinstance(engine, Engine), "prune needs a session bound to an engine"
    session.rollback()
    return [
        partitions.drop_day(engine, day, cutoff, _FINAL, others=_NOT_FINAL, dry_run=dry_run)
        for day in days
    ]
