"""A message's timeline: its attempts and the operator actions on it, in time order.

Every provider call is numbered in sequence (``seq``); a redrive opens the next ``round``, and
its audit row sits between the two.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy.orm import Session

from delivery.core.models import Attempt, Message
from delivery.ops.audit import AuditRow, entries

__all__ = ["Event", "timeline"]


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the timeline: an attempt (``attempt`` set) or an action (``audit`` set).
    ``seq`` numbers the attempts across rounds; ``round`` starts at 1, +1 per redrive."""

    at: dt.datetime
    round: int
    seq: int | None = None
    attempt: Attempt | None = None
    audit: AuditRow | None = None


def timeline(session: Session, message: Message, attempts: list[Attempt]) -> list[Event]:
    """The attempts (oldest first, as ``ops.show`` returns them) and the audit rows of
    ``message`` merged by time; an action and an attempt at the same instant: action first."""
    actions = sorted(entries(session, message_id=message.id, limit=1000), key=lambda a: a.id)
    merged: list[tuple[dt.datetime, int, object]] = [(a.at, 0, a) for a in actions]
    merged += [(a.started_at, 1, a) for a in attempts]
    merged.sort(key=lambda item: (item[0], item[1]))
    events: list[Event] = []
    round_, seq = 1, 0
    for at, _, item in merged:
        if isinstance(item, AuditRow):
            if item.action == "redrive":
                round_ += 1
            events.append(Event(at, round_, audit=item))
        else:
            assert isinstance(item, Attempt)
            seq += 1
            events.append(Event(at, round_, seq=seq, attempt=item))
    return events
