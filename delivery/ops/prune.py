"""Prune: delete final messages with their attempts and receipts, in batches, never an open
one.

``prunable`` counts what ``prune_batch`` would delete; call ``prune_batch`` until it deletes
nothing, committing after each batch (``delivery prune`` does).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, and_, delete, func, select
from sqlalchemy.orm import Session

from delivery.core.models import Attempt, Message, Receipt
from delivery.core.status import FINAL

__all__ = ["PruneBatch", "prunable", "prune_batch"]

_FINAL = tuple(sorted(status.value for status in FINAL))


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
