"""A message's timeline: its attempts, the operator actions on it and its delivery receipts,
in time order (a receipt by when it was received).

Every provider call is numbered in sequence (``seq``); a redrive opens the next ``round``, and
its audit row sits between the two.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from delivery.core.models import Attempt, Message, Receipt
from delivery.ops.audit import AuditRow, entries

__all__ = ["Event", "receipts", "timeline"]


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the timeline: an attempt (``attempt`` set), an action (``audit`` set) or a
    receipt (``receipt`` set). ``seq`` numbers the attempts across rounds; ``round`` starts at
    1, +1 per redrive."""

    at: dt.datetime
    round: int
    seq: int | None = None
    attempt: Attempt | None = None
    audit: AuditRow | None = None
    receipt: Receipt | None = None


def receipts(session: Session, message: Message) -> list[Receipt]:
    """The delivery receipts of ``message``, in the order they were received."""
    query = select(Receipt).where(Receipt.message_id == message.id).order_by(Receipt.id)
    return list(session.scalars(query))


def timeline(session: Session, message: Message, attempts: list[Attempt]) -> list[Event]:
    """The attempts (oldest first, as ``ops.show`` returns them), the audit rows and the
    receipts of ``message`` merged by time; at the same instant: action, attempt, receipt."""
    actions = sorted(entries(session, message_id=message.id, limit=1000), key=lambda a: a.id)
    merged: list[tuple[dt.datetime, int, object]] = [(a.at, 0, a) for a in actions]
    merged += [(a.started_at, 1, a) for a in attempts]
    merged += [(r.received_at, 2, r) for r in receipts(session, message)]
    merged.sort(key=lambda item: (item[0], item[1]))
    events: list[Event] = []
    round_, seq = 1, 0
    for at, _, item in merged:
        if isinstance(item, AuditRow):
            if item.action == "redrive":
                round_ += 1
            events.append(Event(at, round_, audit=item))
        elif isinstance(item, Receipt):
            events.append(Event(at, round_, receipt=item))
        else:
            assert isinstance(item, Attempt)
            seq += 1
            events.append(Event(at, round_, seq=seq, attempt=item))
    return events
