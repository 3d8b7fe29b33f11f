"""The operators' transitions (``delivery.ops.repair``: the CLI, the console, the Django
admin), each one conditional UPDATE in the caller's session, refreshing the message and
emitting its ``Transition`` once it moved:

- ``redrive``: ``dead`` or ``unknown`` -> ``pending``, due now, with a fresh budget of
  attempts counted from here (``unknown`` ones flagged ``needs_lookup``);
- ``resolve``: ``unknown`` -> ``sent`` or ``dead``;
- ``cancel``: ``pending`` -> ``cancelled``.

``resolve`` to ``dead`` is an outcome the app is told of (``add_outcome_hook``), at the
session's commit: each move holds its outcome in ``session.info`` until an ``after_commit``
of the session's outermost transaction (a released savepoint passes it to the transaction
around it); a rollback, or the session closed without a commit, drops it. A caller whose
session never commits itself (Django's borrowed session: Django commits) takes them with
``take_outcomes`` and tells them at its own commit.

Each is fenced on the status only, which is safe: ``dead``, ``unknown`` and ``pending`` are
held by no worker (every worker move starts from ``dispatched`` or ``sending``), no move out
of them changes the attempt count, and the attempt count is what fences every worker move,
so a worker from the message's earlier life can never match its next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import CursorResult, case, event, update
from sqlalchemy.orm import Session, SessionTransaction

from delivery.core.clock import db_now
from delivery.core.models import Message, utcnow
from delivery.core.status import Status
from delivery.observability.events import Outcome, emit_moved, held_outcomes, tell_outcomes

__all__ = ["REDRIVABLE", "RESOLVABLE", "cancel", "redrive", "resolve", "take_outcomes"]

REDRIVABLE = (Status.DEAD, Status.UNKNOWN)
"""The statuses ``redrive`` accepts."""

RESOLVABLE = (Status.SENT, Status.DEAD)
"""The statuses ``resolve`` may declare an ``unknown`` message to be in."""


def redrive(session: Session, message: Message, provider: str | None = None) -> bool:
    """``message`` (``dead`` or ``unknown``) -> ``pending`` with the same key; False if it was
    no longer in either. ``provider``: the one it goes to, unless it is ``pinned`` (an
    attempt on its own may have taken effect; ``delivery.guards.failover``)."""
    previous = message.status
    now = db_now(session.connection())
    values: dict[str, Any] = {
        "status": Status.PENDING.value,
        # The attempt count is every conditional update's fence: it never goes back, so a
        # late worker from an earlier life cannot match this one. The new life gets the
        # message's own budget again, counted from here.
        "max_attempts": Message.attempts + Message.max_attempts - Message.budget_start,
        "budget_start": Message.attempts,
        "next_attempt_at": now,
        "lease_expires_at": None,
        "needs_lookup": case((Message.status == Status.UNKNOWN.value, True), else_=False),
        "updated_at": now,
    }
    if provider is not None:
        values["provider"] = case((Message.pinned, Message.provider), else_=provider)
    return _move(session, message, REDRIVABLE, values, (previous, "redrive"))


def resolve(session: Session, message: Message, to: Status) -> bool:
    """``message`` (``unknown``) -> ``to`` (``sent``: ``sent_at`` now; ``dead``: its last
    error kept); False if it was no longer ``unknown``."""
    now = utcnow()
    values: dict[str, Any] = {"status": to.value, "lease_expires_at": None, "updated_at": now}
    if to is Status.SENT:
        values.update(sent_at=now, needs_lookup=False)
    return _move(session, message, (Status.UNKNOWN,), values, (message.status, "resolve"))


def cancel(session: Session, message: Message) -> bool:
    """``message`` (``pending``) -> ``cancelled``; False if it was no longer ``pending``."""
    values = {"status": Status.CANCELLED.value, "lease_expires_at": None, "updated_at": utcnow()}
    return _move(session, message, (Status.PENDING,), values, (message.status, "cancel"))


def _move(
    session: Session,
    message: Message,
    expected: Sequence[Status],
    values: dict[str, Any],
    why: tuple[str, str],
) -> bool:
    """The one UPDATE of a repair: change ``message`` only while its status is still one of
    ``expected``; refresh it either way, and emit the transition (``why``: the status it was
    seen in, and the outcome) if it moved."""
    statement = (
        update(Message)
        .where(Message.id == message.id, Message.status.in_([s.value for s in expected]))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    done = bool(cast(CursorResult[Any], session.execute(statement)).rowcount)
    session.refresh(message)
    if done:
        previous, outcome = why
        with held_outcomes() as held:
            emit_moved(message, previous, message.status, outcome)
        _hold(session, held)
    return done


#: ``session.info``'s key: the outcomes held for the session's commit, each with the savepoint
#: it was made in (None: the outermost transaction).
_HELD = "delivery.outcomes"
_Held = list[tuple[SessionTransaction | None, Outcome]]


def take_outcomes(session: Session) -> list[Outcome]:
    """The outcomes of the repairs made in ``session`` and not yet told, taken from it: for a
    caller whose session never commits itself, to tell them (``tell_outcomes``) once its own
    transaction committed (the Django admin, with ``transaction.on_commit``)."""
    held: _Held = session.info.pop(_HELD, [])
    return [outcome for _, outcome in held]


def _hold(session: Session, outcomes: list[Outcome]) -> None:
    if not outcomes:
        return
    where = session.get_nested_transaction()
    held: _Held = session.info.setdefault(_HELD, [])
    held.extend((where, outcome) for outcome in outcomes)
    if not event.contains(session, "after_commit", _committed):
        event.listen(session, "after_commit", _committed)
        event.listen(session, "after_transaction_end", _ended)


def _committed(session: Session) -> None:
    """The outermost transaction committed: tell its outcomes. A savepoint released: its
    outcomes now wait for the transaction around it."""
    savepoint = session.get_nested_transaction()
    if savepoint is None:
        tell_outcomes(take_outcomes(session))
        return
    around = _savepoint_around(savepoint)
    held: _Held = session.info.get(_HELD, [])
    held[:] = [(around if where is savepoint else where, o) for where, o in held]


def _ended(session: Session, transaction: SessionTransaction) -> None:
    """A transaction ended without the commit that told (or passed on) its outcomes: a
    rollback, or the session closed. The outermost one drops them all, a savepoint its own."""
    if transaction.parent is None:
        session.info.pop(_HELD, None)
    elif transaction.nested and _HELD in session.info:
        held: _Held = session.info[_HELD]
        held[:] = [(where, o) for where, o in held if where is not transaction]


def _savepoint_around(savepoint: SessionTransaction) -> SessionTransaction | None:
    """The savepoint that encloses ``savepoint``, or None (the outermost transaction)."""
    parent = savepoint.parent
    while parent is not None and not parent.nested:
        parent = parent.parent
    return parent
