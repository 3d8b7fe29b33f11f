"""Ops queries and repairs over the outbox, free of any CLI or web framework.

Every function takes a SQLAlchemy ``Session`` and never commits: the caller decides (the
``delivery`` CLI commits after a successful ``redrive``). A ``ref`` is a message's idempotency
key or, when it is all digits and no key matches, its numeric id.

Repairs, each a conditional UPDATE on the expected status (a concurrent change is reported,
never overwritten) that emits a ``Transition``:

- ``redrive``: ``dead`` or ``unknown`` back to ``pending`` with the same key, so a provider
  that deduplicates on it cannot deliver it twice. An ``unknown`` message may already have
  been delivered, so it is redriven with ``needs_lookup`` set: the worker asks first.
- ``resolve``: an ``unknown`` message is declared ``sent`` or ``dead`` after a human checked.
- ``cancel``: ``pending`` -> ``cancelled``; once dispatched it is too late.
- ``prune_batch``: deletes one batch of final messages (and their attempts) last changed
  before a cutoff; never an open one.

Queries for dashboards: ``stats``, ``stats_by_provider``, ``oldest_pending_age``,
``relay_lag``, ``rates``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, and_, case, delete, func, or_, select, update
from sqlalchemy.orm import Session

from delivery.errors import MessageNotFound
from delivery.events import Transition, emit, mask
from delivery.models import Attempt, Message, utcnow
from delivery.status import FINAL, Status
from delivery.validation import canonical_json

__all__ = [
    "REDRIVABLE",
    "RESOLVABLE",
    "CancelResult",
    "PruneBatch",
    "RedriveResult",
    "ResolveResult",
    "attempt_dict",
    "cancel",
    "dead",
    "dead_ids",
    "find",
    "message_dict",
    "oldest_pending_age",
    "prunable",
    "prune_batch",
    "rates",
    "redrive",
    "redrive_ids",
    "relay_lag",
    "resolve",
    "show",
    "stats",
    "stats_by_provider",
]

REDRIVABLE = (Status.DEAD, Status.UNKNOWN)
"""The statuses ``redrive`` accepts."""

RESOLVABLE = (Status.SENT, Status.DEAD)
"""The statuses ``resolve`` may declare an ``unknown`` message to be in."""

_OPEN = (Status.PENDING.value, Status.DISPATCHED.value, Status.SENDING.value)
_FINAL = tuple(sorted(status.value for status in FINAL))

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


@dataclass(frozen=True, slots=True)
class ResolveResult:
    """What ``resolve`` did. ``resolved`` is false (with a ``reason``) unless it was unknown."""

    ref: str
    id: int
    key: str
    from_status: str
    to_status: str
    resolved: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What ``cancel`` did. ``too_late`` when a worker already has (or had) the message."""

    ref: str
    id: int
    key: str
    from_status: str
    cancelled: bool
    too_late: bool = False
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PruneBatch:
    """One ``prune_batch``: how many messages and attempt rows it deleted."""

    messages: int
    attempts: int


def stats(session: Session) -> dict[str, int]:
    """The number of messages in every status, in ``Status`` order, zeros included."""
    rows = session.execute(select(Message.status, func.count()).group_by(Message.status)).all()
    counts = {str(status): int(count) for status, count in rows}
    return {status.value: counts.get(status.value, 0) for status in Status}


def stats_by_provider(session: Session) -> dict[str, dict[str, int]]:
    """Provider name -> the number of its messages in every status (``Status`` order, zeros
    included), providers sorted by name. Only providers with messages appear."""
    rows = session.execute(
        select(Message.provider, Message.status, func.count()).group_by(
            Message.provider, Message.status
        )
    ).all()
    found: dict[str, dict[str, int]] = {}
    for provider, status, count in rows:
        found.setdefault(str(provider), {})[str(status)] = int(count)
    return {
        provider: {status.value: counts.get(status.value, 0) for status in Status}
        for provider, counts in sorted(found.items())
    }


def oldest_pending_age(session: Session, *, now: dt.datetime | None = None) -> float | None:
    """Seconds since the oldest still-open message was enqueued (``created_at``), or ``None``.

    Open means ``pending``, ``dispatched`` or ``sending``; a message scheduled for later
    (``send_at``) that has not had its first attempt and is not due yet does not count.
    """
    now = now or utcnow()
    waiting = or_(Message.attempts > 0, Message.next_attempt_at <= now)
    oldest = session.scalar(
        select(func.min(Message.created_at)).where(Message.status.in_(_OPEN), waiting)
    )
    return None if oldest is None else max(0.0, (now - _aware(oldest)).total_seconds())


def relay_lag(session: Session, *, now: dt.datetime | None = None) -> float:
    """Seconds the most overdue ``pending`` row has been due without being claimed (0 if
    none): how far the relay is behind."""
    now = now or utcnow()
    due = session.scalar(
        select(func.min(Message.next_attempt_at)).where(
            Message.status == Status.PENDING.value, Message.next_attempt_at <= now
        )
    )
    return 0.0 if due is None else max(0.0, (now - _aware(due)).total_seconds())


def rates(
    session: Session, *, window: float = 60.0, now: dt.datetime | None = None
) -> dict[str, float]:
    """Messages per minute over the last ``window`` seconds: ``enqueued`` (created), ``sent``
    (accepted by the provider), ``dead`` (died), and ``attempts`` (provider calls)."""
    now = now or utcnow()
    since = now - dt.timedelta(seconds=window)
    counts = {
        "enqueued": session.scalar(
            select(func.count()).select_from(Message).where(Message.created_at >= since)
        ),
        "sent": session.scalar(
            select(func.count()).select_from(Message).where(Message.sent_at >= since)
        ),
        "dead": session.scalar(
            select(func.count())
            .select_from(Message)
            .where(Message.status == Status.DEAD.value, Message.updated_at >= since)
        ),
        "attempts": session.scalar(
            select(func.count()).select_from(Attempt).where(Attempt.started_at >= since)
        ),
    }
    return {name: round(int(n or 0) * 60.0 / window, 2) for name, n in counts.items()}


def _aware(value: dt.datetime) -> dt.datetime:
    """Aggregates bypass the column type: SQLite returns naive (UTC) datetimes, or text."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


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
    return _redrive(session, [(ref, find(session, ref)) for ref in refs])


def dead_ids(
    session: Session, *, since: dt.datetime | None = None, code: str | None = None
) -> list[int]:
    """The ids of every dead message (oldest id first), filtered like ``dead``."""
    query = select(Message.id).where(Message.status == Status.DEAD.value)
    if since is not None:
        query = query.where(Message.updated_at >= since)
    if code is not None:
        query = query.where(Message.last_error_code == code)
    return list(session.scalars(query.order_by(Message.id)))


def redrive_ids(session: Session, ids: Sequence[int]) -> list[RedriveResult]:
    """``redrive`` by message id (bulk redrive); ids that no longer exist are skipped."""
    messages = session.scalars(select(Message).where(Message.id.in_(ids)).order_by(Message.id))
    return _redrive(session, [(str(message.id), message) for message in messages])


def _redrive(session: Session, messages: Sequence[tuple[str, Message]]) -> list[RedriveResult]:
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


def resolve(session: Session, ref: str, to_status: Status | str) -> ResolveResult:
    """Declare an ``unknown`` message ``sent`` or ``dead`` after checking with the provider.

    ``sent`` sets ``sent_at`` to now; ``dead`` keeps the last error for the record. Any other
    status of the message is left alone and reported with ``resolved=False``. The caller
    commits; a ``Transition`` with ``outcome="resolve"`` is emitted.
    """
    target = Status(to_status)
    if target not in RESOLVABLE:
        raise ValueError(f"to_status: {target.value!r} is not one of sent, dead")
    message = find(session, ref)
    previous = message.status
    if previous != Status.UNKNOWN.value:
        reason = f"message is {previous}; only unknown messages can be resolved"
        return ResolveResult(ref, message.id, message.key, previous, target.value, False, reason)
    now = utcnow()
    values: dict[str, Any] = {"status": target.value, "lease_expires_at": None, "updated_at": now}
    if target is Status.SENT:
        values.update(sent_at=now, needs_lookup=False)
    done = _conditional(session, message, Status.UNKNOWN, values)
    if not done:
        reason = f"message changed to {message.status} while resolving; nothing done"
        return ResolveResult(ref, message.id, message.key, previous, target.value, False, reason)
    emit(
        Transition(
            message.id,
            message.key,
            message.provider,
            previous,
            target.value,
            message.attempts,
            outcome="resolve",
        )
    )
    return ResolveResult(ref, message.id, message.key, previous, target.value, True)


def cancel(session: Session, ref: str) -> CancelResult:
    """Cancel a ``pending`` message: it will never be sent.

    A message a worker may already be sending (``dispatched``, ``sending``) is reported
    ``too_late``; a final one is reported as such. The update is conditional on
    ``pending``, so a relay that claims it at the same moment wins and ``too_late`` is
    reported. The caller commits; a ``Transition`` with ``outcome="cancel"`` is emitted.
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
    values = {"status": Status.CANCELLED.value, "lease_expires_at": None, "updated_at": utcnow()}
    if not _conditional(session, message, Status.PENDING, values):
        reason = f"too late: message changed to {message.status} while cancelling"
        return CancelResult(ref, message.id, message.key, previous, False, True, reason)
    emit(
        Transition(
            message.id,
            message.key,
            message.provider,
            previous,
            Status.CANCELLED.value,
            message.attempts,
            outcome="cancel",
        )
    )
    return CancelResult(ref, message.id, message.key, previous, True)


def _conditional(
    session: Session, message: Message, expected: Status, values: dict[str, Any]
) -> bool:
    """UPDATE the message only while it is still ``expected``; refresh it either way."""
    statement = (
        update(Message)
        .where(Message.id == message.id, Message.status == expected.value)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    done = cast(CursorResult[Any], session.execute(statement)).rowcount
    session.refresh(message)
    return bool(done)


def _prunable(cutoff: dt.datetime) -> ColumnElement[bool]:
    return and_(Message.status.in_(_FINAL), Message.updated_at < cutoff)


def prunable(session: Session, cutoff: dt.datetime) -> int:
    """How many final messages were last changed before ``cutoff`` (what ``prune`` deletes)."""
    return int(session.scalar(select(func.count()).where(_prunable(cutoff))) or 0)


def prune_batch(session: Session, cutoff: dt.datetime, *, limit: int = 1000) -> PruneBatch:
    """Delete up to ``limit`` final messages last changed before ``cutoff``, with their
    attempts. Open messages (pending, dispatched, sending) are never touched.

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
