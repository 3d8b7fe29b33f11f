"""Repair messages: redrive, resolve, cancel.

Each repair is one conditional UPDATE on the expected status (``delivery.transitions.repair``,
which emits its ``Transition``): a concurrent change is reported, never overwritten. Every
change writes an audit row (``actor``: who asked; ``delivery.ops.audit``) in the caller's
transaction, and the caller commits.

- ``redrive``: ``dead`` or ``unknown`` back to ``pending`` with the same key and a fresh budget
  of attempts; an ``unknown`` one may have been delivered, so it gets ``needs_lookup``. One
  that is not ``pinned`` goes to the first provider of its route whose breaker is closed
  (``delivery.guards.failover.redrive_provider``).
- ``resolve``: an ``unknown`` message is declared ``sent`` or ``dead`` after a human checked;
  a ``dead`` one is told to the app's outcome hooks at the session's commit
  (``take_outcomes``: for a session that never commits itself).
- ``cancel``: ``pending`` -> ``cancelled``; once dispatched it is too late.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from delivery.core.models import Message
from delivery.core.status import Status
from delivery.guards.breaker import Breakers
from delivery.guards.failover import redrive_provider
from delivery.ops.audit import DEFAULT_ACTOR, record
from delivery.ops.inspect import find
from delivery.runtime.current import get_settings
from delivery.transitions import repair as transitions
from delivery.transitions.repair import REDRIVABLE, RESOLVABLE, take_outcomes

__all__ = [
    "REDRIVABLE",
    "RESOLVABLE",
    "CancelResult",
    "RedriveResult",
    "ResolveResult",
    "cancel",
    "redrive",
    "redrive_ids",
    "resolve",
    "take_outcomes",
]


@dataclass(frozen=True, slots=True)
class _Repaired:
    """Which message a ref named (``id``, ``key``) and the status it was found in."""

    ref: str
    id: int
    key: str
    from_status: str


@dataclass(frozen=True, slots=True)
class RedriveResult(_Repaired):
    """What ``redrive`` did with one ref. ``reason`` says why when ``redriven`` is false."""

    redriven: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ResolveResult(_Repaired):
    """What ``resolve`` did. ``resolved`` is false (with a ``reason``) unless it was unknown."""

    to_status: str
    resolved: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class CancelResult(_Repaired):
    """What ``cancel`` did. ``too_late`` when a worker already has (or had) the message."""

    cancelled: bool
    too_late: bool = False
    reason: str | None = None


def redrive(
    session: Session, refs: Sequence[str], *, actor: str = DEFAULT_ACTOR
) -> list[RedriveResult]:
    """Put ``dead`` and ``unknown`` messages back to ``pending`` with the same key, due now.

    Each gets a fresh budget of attempts (as many as it was enqueued with); its attempt count
    goes on (the fence of every conditional update never goes back) and its last error is kept.
    An ``unknown`` one gets ``needs_lookup``: a provider with a lookup is asked before it is
    sent again. Messages in any other status are reported with ``redriven=False`` and a reason.
    Every ref is found before anything changes: a missing one raises ``MessageNotFound``.
    """
    return _redrive(session, [(ref, find(session, ref)) for ref in refs], actor)


def redrive_ids(
    session: Session, ids: Sequence[int], *, actor: str = DEFAULT_ACTOR
) -> list[RedriveResult]:
    """``redrive`` by message id (bulk redrive); ids that no longer exist are skipped."""
    messages = session.scalars(select(Message).where(Message.id.in_(ids)).order_by(Message.id))
    return _redrive(session, [(str(message.id), message) for message in messages], actor)


def _redrive(
    session: Session, messages: Sequence[tuple[str, Message]], actor: str
) -> list[RedriveResult]:
    allowed = [status.value for status in REDRIVABLE]
    results: list[RedriveResult] = []
    states = _BreakerStates()
    try:
        for ref, message in messages:
            previous, was = message.status, message.provider
            reason: str | None = None
            if previous not in allowed:
                reason = (
                    f"message is {previous}; only {' or '.join(allowed)} messages can be redriven"
                )
            elif not transitions.redrive(session, message, states.provider_for(message)):
                reason = f"message changed to {message.status} while redriving; nothing done"
            else:
                detail = "provider asked first (lookup)" if message.needs_lookup else "same key"
                if message.provider != was:
                    detail += f"; through {message.provider} ({was}'s breaker is not closed)"
                record(
                    session,
                    actor=actor,
                    action="redrive",
                    message=message,
                    from_status=previous,
                    to_status=Status.PENDING.value,
                    detail=detail,
                )
            results.append(
                RedriveResult(ref, message.id, message.key, previous, reason is None, reason)
            )
    finally:
        states.close()
    return results


class _BreakerStates:
    """The breakers of this process's settings, read once per provider for one redrive."""

    def __init__(self) -> None:
        self._settings = get_settings()
        self._breakers: Breakers | None = None
        self._states: dict[str, str] = {}

    def provider_for(self, message: Message) -> str | None:
        return redrive_provider(self._settings, message, self._state)

    def _state(self, name: str) -> str:
        if name not in self._states:
            if self._breakers is None:
                self._breakers = Breakers(self._settings)
            self._states[name] = self._breakers.get(name).status().state
        return self._states[name]

    def close(self) -> None:
        if self._breakers is not None:
            self._breakers.close()


def resolve(
    session: Session, ref: str, to_status: Status | str, *, actor: str = DEFAULT_ACTOR
) -> ResolveResult:
    """Declare an ``unknown`` message ``sent`` or ``dead`` after checking with the provider.

    ``sent`` sets ``sent_at`` to now; ``dead`` keeps the last error for the record. Any other
    status of the message is left alone and reported with ``resolved=False``.
    """
    target = Status(to_status)
    if target not in RESOLVABLE:
        raise ValueError(f"to_status: {target.value!r} is not one of sent, dead")
    message = find(session, ref)
    previous = message.status
    if previous != Status.UNKNOWN.value:
        reason = f"message is {previous}; only unknown messages can be resolved"
        return ResolveResult(ref, message.id, message.key, previous, target.value, False, reason)
    if not transitions.resolve(session, message, target):
        reason = f"message changed to {message.status} while resolving; nothing done"
        return ResolveResult(ref, message.id, message.key, previous, target.value, False, reason)
    record(
        session,
        actor=actor,
        action="resolve",
        message=message,
        from_status=previous,
        to_status=target.value,
    )
    return ResolveResult(ref, message.id, message.key, previous, target.value, True)


def cancel(session: Session, ref: str, *, actor: str = DEFAULT_ACTOR) -> CancelResult:
    """Cancel a ``pending`` message: it will never be sent.

    A message a worker may already be sending (``dispatched``, ``sending``) is reported
    ``too_late``; a final one is reported as such. A relay that claims it at the same moment
    wins and ``too_late`` is reported.
    """
    message = find(session, ref)
    previous = message.status
    if previous != Status.PENDING.value:
        too_late = previous in (Status.DISPATCHED.value, Status.SENDING.value)
        reason = (
            f"too late: message is {previous} (a worker may be sending it)"
            if too_late
            else f"message is already {previous}"
        )
        return CancelResult(ref, message.id, message.key, previous, False, too_late, reason)
    if not transitions.cancel(session, message):
        reason = f"too late: message changed to {message.status} while cancelling"
        return CancelResult(ref, message.id, message.key, previous, False, True, reason)
    record(
        session,
        actor=actor,
        action="cancel",
        message=message,
        from_status=previous,
        to_status=Status.CANCELLED.value,
    )
    return CancelResult(ref, message.id, message.key, previous, True)
