"""A message's timeline: its attempts, the operator actions on it, its delivery receipts and
its moves to another provider, in time order (a receipt by when it was received).

Every provider call is numbered in sequence (``seq``); a redrive opens the next ``round``, and
its audit row sits between the two. A failover is not a row of its own: it shows where two
attempts of one round called different providers, or where the message's provider is no
longer the one its last attempt called (``Move``; a provider a redrive chose is told by the
redrive's audit row).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from delivery.core.models import Attempt, Message, Receipt
from delivery.ops.audit import AuditRow, entries
from delivery.ops.inspect import attempt_provider
from delivery.transitions.failover import FAILOVER

__all__ = ["Event", "Move", "receipts", "timeline"]


@dataclass(frozen=True, slots=True)
class Move:
    """The message went on at ``to_provider`` after its attempts at ``from_provider`` (None:
    it made none there; its stored reason names it). ``latest``: the move its row still tells
    of (``last_error_code`` ``FAILOVER``; its ``last_error`` says why). When it happened is not
    recorded: the event's ``at`` only places it."""

    from_provider: str | None
    to_provider: str
    latest: bool = False


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the timeline: an attempt (``attempt`` set), an action (``audit`` set), a
    receipt (``receipt`` set) or a move to another provider (``move`` set). ``seq`` numbers
    the attempts across rounds; ``round`` starts at 1, +1 per redrive."""

    at: dt.datetime
    round: int
    seq: int | None = None
    attempt: Attempt | None = None
    audit: AuditRow | None = None
    receipt: Receipt | None = None
    move: Move | None = None


def receipts(session: Session, message: Message) -> list[Receipt]:
    """The delivery receipts of ``message``, in the order they were received."""
    query = select(Receipt).where(Receipt.message_id == message.id).order_by(Receipt.id)
    return list(session.scalars(query))


def timeline(session: Session, message: Message, attempts: list[Attempt]) -> list[Event]:
    """The attempts (oldest first, as ``ops.show`` returns them), the audit rows and the
    receipts of ``message`` merged by time; at the same instant: action, attempt, receipt.
    Its moves to another provider between them (``Move``)."""
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
    return _with_moves(message, events)


def _with_moves(message: Message, events: list[Event]) -> list[Event]:
    """``events`` with a ``Move`` before each attempt of a round that called another provider
    than the round's attempt before it, and one after the last attempt (or redrive) when the
    message is on another provider since: it failed over (``FAILOVER``), or its last attempt
    was made elsewhere and no redrive came after it."""
    found: list[Event] = []
    last: str | None = None  # the provider of the last attempt of this round
    after = -1  # where a move since the last attempt or redrive goes: after found[after]
    redriven = False  # a redrive came after the last attempt
    for event in events:
        if event.audit is not None and event.audit.action == "redrive":
            last, after, redriven = None, len(found), True
        elif event.attempt is not None:
            called = attempt_provider(event.attempt, message)
            if last is not None and called != last:
                found.append(Event(event.at, event.round, move=Move(last, called)))
            last, after, redriven = called, len(found), False
        found.append(event)
    tried = [e.attempt for e in events if e.attempt is not None]
    previous = attempt_provider(tried[-1], message) if tried else None
    failed_over = message.last_error_code == FAILOVER
    if message.provider != previous and (failed_over or (tried and not redriven)):
        where = found[after] if after >= 0 else Event(message.created_at, 1)
        move = Move(previous, message.provider, latest=failed_over)
        found.insert(after + 1, Event(where.at, where.round, move=move))
    return found
