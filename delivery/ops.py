"""Ops queries and repairs over the outbox, free of any CLI or web framework.

Every function takes a SQLAlchemy ``Session`` and never commits: the caller decides (the
``delivery`` CLI commits after a successful ``redrive``). A ``ref`` is a message's idempotency
key or, when it is all digits and no key matches, its numeric id.

Redrive is the only repair here: a ``dead`` or ``unknown`` message goes back to ``pending``
with the same key, so a provider that deduplicates on it cannot deliver it twice. An
``unknown`` message may already have been delivered, so it is redriven with ``needs_lookup``
set: the worker asks the provider before sending again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, case, func, select, update
from sqlalchemy.orm import Session

from delivery.errors import MessageNotFound
from delivery.events import Transition, emit, mask
from delivery.models import Attempt, Message, utcnow
from delivery.status import Status
from delivery.validation import canonical_json

__all__ = [
    "REDRIVABLE",
    "RedriveResult",
    "attempt_dict",
    "dead",
    "find",
    "message_dict",
    "redrive",
    "show",
    "stats",
]

REDRIVABLE = (Status.DEAD, Status.UNKNOWN)
"""The statuses ``redrive`` accepts."""

_MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class RedriveResult:
    """What ``redrive`` did with one ref. ``reason`` says why when ``redriven`` is false."""

    ref: str
    id: int
    key: str
    from_status: str
    redriven: bool
    reason: str | None = None


def stats(session: Session) -> dict[str, int]:
    """The number of messages in every status, in ``Status`` order, zeros included."""
    rows = session.execute(select(Message.status, func.count()).group_by(Message.status)).all()
    counts = {str(status): int(count) for status, count in rows}
    return {status.value: counts.get(status.value, 0) for status in Status}


def find(session: Session, ref: str) -> Message:
    """The message whose key is ``ref``, else whose id is ``ref`` (all digits).

    Raises ``MessageNotFound`` when neither matches.
    """
    message = session.scalars(select(Message).where(Message.key == ref)).one_or_none()
    if message is None and ref.isascii() and ref.isdigit() and int(ref) <= _MAX_ID:
        message = session.get(Message, int(ref))
    if message is None:
        raise MessageNotFound(ref)
    return message


def dead(
    session: Session,
    *,
    since: dt.datetime | None = None,
    code: str | None = None,
    limit: int = 100,
) -> list[Message]:
    """Dead messages, most recently updated first.

    ``since`` keeps those updated at or after it; ``code`` those whose ``last_error_code`` is
    exactly it; at most ``limit`` are returned.
    """
    query = select(Message).where(Message.status == Status.DEAD.value)
    if since is not None:
        query = query.where(Message.updated_at >= since)
    if code is not None:
        query = query.where(Message.last_error_code == code)
    query = query.order_by(Message.updated_at.desc(), Message.id.desc()).limit(limit)
    return list(session.scalars(query))


def show(session: Session, ref: str) -> tuple[Message, list[Attempt]]:
    """A message and its whole attempt log, oldest attempt first."""
    message = find(session, ref)
    attempts = session.scalars(
        select(Attempt).where(Attempt.message_id == message.id).order_by(Attempt.id)
    )
    return message, list(attempts)


def redrive(session: Session, refs: Sequence[str]) -> list[RedriveResult]:
    """Put ``dead`` and ``unknown`` messages back to ``pending`` with the same key.

    Attempts restart at 0 and the message is due now; ``last_error_code``/``last_error`` are
    kept for the record. A message that was ``unknown`` gets ``needs_lookup`` so that the
    provider is asked before it is sent again. Messages in any other status are left alone
    and reported with ``redriven=False`` and a reason. Every ref is resolved before anything
    changes: a missing one raises ``MessageNotFound``. Each update is conditional on the
    status, so a concurrent change is reported, never overwritten. The caller commits; a
    ``Transition`` with ``outcome="redrive"`` is emitted for each redriven message.
    """
    messages = [(ref, find(session, ref)) for ref in refs]
    allowed = [status.value for status in REDRIVABLE]
    results: list[RedriveResult] = []
    for ref, message in messages:
        previous = message.status
        if previous not in allowed:
            reason = f"message is {previous}; only {' or '.join(allowed)} messages can be redriven"
            results.append(RedriveResult(ref, message.id, message.key, previous, False, reason))
            continue
        now = utcnow()
        statement = (
            update(Message)
            .where(Message.id == message.id, Message.status.in_(allowed))
            .values(
                status=Status.PENDING.value,
                attempts=0,
                next_attempt_at=now,
                lease_expires_at=None,
                needs_lookup=case((Message.status == Status.UNKNOWN.value, True), else_=False),
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        done = cast(CursorResult[Any], session.execute(statement)).rowcount
        session.refresh(message)
        if not done:
            reason = f"message changed to {message.status} while redriving; nothing done"
            results.append(RedriveResult(ref, message.id, message.key, previous, False, reason))
            continue
        emit(
            Transition(
                message.id,
                message.key,
                message.provider,
                previous,
                Status.PENDING.value,
                0,
                outcome="redrive",
            )
        )
        results.append(RedriveResult(ref, message.id, message.key, previous, True))
    return results


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def attempt_dict(attempt: Attempt) -> dict[str, Any]:
    """A JSON-ready dict of one attempt."""
    return {
        "id": attempt.id,
        "number": attempt.number,
        "kind": attempt.kind,
        "started_at": _iso(attempt.started_at),
        "outcome": attempt.outcome,
        "http_status": attempt.http_status,
        "error_code": attempt.error_code,
        "error": attempt.error,
        "latency_ms": attempt.latency_ms,
    }


def message_dict(
    message: Message,
    attempts: Sequence[Attempt] | None = None,
    *,
    reveal: bool = False,
) -> dict[str, Any]:
    """A JSON-ready dict of a message (ISO-8601 datetimes).

    Unless ``reveal``, the recipient is masked and the payload replaced by its size
    (``"<hidden: N bytes>"``). ``attempts``, when given, are included as ``"attempts"``.
    """
    if reveal:
        payload: Any = message.payload
    else:
        payload = f"<hidden: {len(canonical_json(message.payload).encode())} bytes>"
    data: dict[str, Any] = {
        "id": message.id,
        "key": message.key,
        "channel": message.channel,
        "provider": message.provider,
        "recipient": message.recipient if reveal else mask(message.recipient),
        "status": message.status,
        "attempt_count": message.attempts,
        "max_attempts": message.max_attempts,
        "on_unknown": message.on_unknown,
        "needs_lookup": message.needs_lookup,
        "next_attempt_at": _iso(message.next_attempt_at),
        "lease_expires_at": _iso(message.lease_expires_at),
        "last_error_code": message.last_error_code,
        "last_error": message.last_error,
        "provider_ref": message.provider_ref,
        "payload_hash": message.payload_hash,
        "payload": payload,
        "created_at": _iso(message.created_at),
        "updated_at": _iso(message.updated_at),
        "sent_at": _iso(message.sent_at),
    }
    if attempts is not None:
        data["attempts"] = [attempt_dict(attempt) for attempt in attempts]
    return data
