"""Read the outbox: counts, ages and rates for dashboards, one message and its attempt log,
its route (the providers it went through: ``route``), and their JSON-ready views (recipient
masked, payload hidden unless revealed).

Every function takes a SQLAlchemy ``Session``, changes nothing and never commits. A ``ref`` is
a message's idempotency key or, when it is all digits and no key matches, its numeric id.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from delivery.core import bounds
from delivery.core.models import Attempt, Message, Receipt, utcnow
from delivery.core.status import Status
from delivery.errors import MessageNotFound
from delivery.observability.events import mask
from delivery.observability.tracing import trace_id
from delivery.outbox.validation import canonical_json
from delivery.runtime import partitions

__all__ = [
    "attempt_dict",
    "attempt_provider",
    "dead",
    "dead_ids",
    "find",
    "message_dict",
    "oldest_pending_age",
    "rates",
    "receipt_dict",
    "relay_lag",
    "route",
    "route_of",
    "show",
    "stats",
    "stats_by_provider",
]

_OPEN = (Status.PENDING.value, Status.DISPATCHED.value, Status.SENDING.value)

_MAX_ID = 2**63 - 1


def stats(session: Session) -> dict[str, int]:
    """The number of messages in every status, in ``Status`` order, zeros included."""
    rows = session.execute(select(Message.status, func.count()).group_by(Message.status)).all()
    return _every_status({str(status): int(count) for status, count in rows})


def _every_status(counts: dict[str, int]) -> dict[str, int]:
    """``counts`` by status in ``Status`` order, zeros included."""
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
    return {provider: _every_status(counts) for provider, counts in sorted(found.items())}


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


def days_ahead(session: Session) -> int | None:
    """How many days after today a partitioned outbox can take messages (beat creates them
    ahead; at -1 an ``enqueue`` fails); None when the outbox is not partitioned."""
    return partitions.days_ahead(session.connection())


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
    where: dict[str, tuple[Any, ...]] = {
        "enqueued": (Message, Message.created_at >= since),
        "sent": (Message, Message.sent_at >= since),
        "dead": (Message, Message.status == Status.DEAD.value, Message.updated_at >= since),
        "attempts": (Attempt, Attempt.started_at >= since),
    }
    found = {}
    for name, (table, *conditions) in where.items():
        n = session.scalar(select(func.count()).select_from(table).where(*conditions))
        found[name] = round(int(n or 0) * 60.0 / window, 2)
    return found


def _aware(value: dt.datetime) -> dt.datetime:
    """Aggregates bypass the column type: SQLite returns naive (UTC) datetimes, or text."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def find(session: Session, ref: str) -> Message:
    """The message whose key is ``ref``, else whose id is ``ref``; ``MessageNotFound`` if none."""
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
    """At most ``limit`` dead messages, most recently updated first: those updated at or after
    ``since``, those whose ``last_error_code`` is ``code``."""
    query = _dead(select(Message), since, code)
    query = query.order_by(Message.updated_at.desc(), Message.id.desc()).limit(limit)
    return list(session.scalars(query))


def _dead(query: Select[Any], since: dt.datetime | None, code: str | None) -> Select[Any]:
    """``query`` kept to dead messages, ``since`` and ``code`` as ``dead`` takes them."""
    query = query.where(Message.status == Status.DEAD.value)
    if since is not None:
        query = query.where(Message.updated_at >= since)
    if code is not None:
        query = query.where(Message.last_error_code == code)
    return query


def show(session: Session, ref: str) -> tuple[Message, list[Attempt]]:
    """A message and its whole attempt log, oldest attempt first."""
    message = find(session, ref)
    attempts = session.scalars(
        select(Attempt).where(Attempt.message_id == message.id).order_by(Attempt.id)
    )
    return message, list(attempts)


def dead_ids(
    session: Session, *, since: dt.datetime | None = None, code: str | None = None
) -> list[int]:
    """The ids of every dead message (oldest id first), filtered like ``dead``."""
    return list(session.scalars(_dead(select(Message.id), since, code).order_by(Message.id)))


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _masked(value: str | None, recipient: str | None) -> str | None:
    """Stored provider text is masked when it is stored; rows older than that are masked
    here again (the message's recipient, numbers, emails)."""
    return None if value is None else bounds.text(value, len(value) + 1, recipient)


def attempt_provider(attempt: Attempt, message: Message) -> str:
    """The provider ``attempt`` called: its own ``provider``, or, on a row written before
    failover existed (NULL), its message's (no message could change provider then)."""
    return attempt.provider or message.provider


def route_of(current: str, called: Iterable[str | None]) -> list[str]:
    """A message's route: the providers its attempts called (``called``, oldest first, None
    for a row written before failover: ``current``), a provider repeated in a row named once,
    then ``current``, the provider it is on now, when its last attempt was elsewhere (it
    failed over, or a redrive moved it, and has not been tried there yet)."""
    route: list[str] = []
    for provider in called:
        name = provider or current
        if not route or route[-1] != name:
            route.append(name)
    if not route or route[-1] != current:
        route.append(current)
    return route


def route(message: Message, attempts: Iterable[Attempt]) -> list[str]:
    """The providers ``message`` went through, in order (``route_of``): ``["stub"]`` for one
    that never moved, ``["primary", "backup"]`` for one that failed over."""
    return route_of(message.provider, (attempt.provider for attempt in attempts))


def attempt_dict(
    attempt: Attempt, *, recipient: str | None = None, provider: str | None = None
) -> dict[str, Any]:
    """A JSON-ready dict of one attempt; its error text masked for ``recipient`` (and for
    phone numbers and emails) unless ``recipient`` is ``None``. ``provider``: the one it
    called, when its row does not say (written before failover: its message's)."""
    return {
        "id": attempt.id,
        "number": attempt.number,
        "kind": attempt.kind,
        "provider": attempt.provider or provider,
        "started_at": _iso(attempt.started_at),
        "outcome": attempt.outcome,
        "http_status": attempt.http_status,
        "error_code": attempt.error_code,
        "error": attempt.error if recipient is None else _masked(attempt.error, recipient),
        "latency_ms": attempt.latency_ms,
    }


def receipt_dict(receipt: Receipt) -> dict[str, Any]:
    """A JSON-ready dict of one delivery receipt (it holds no recipient)."""
    return {
        "id": receipt.id,
        "event": receipt.event,
        "status": receipt.status,
        "code": receipt.code,
        "provider_at": _iso(receipt.provider_at),
        "received_at": _iso(receipt.received_at),
        "effect": receipt.effect,
    }


def message_dict(
    message: Message,
    attempts: Sequence[Attempt] | None = None,
    *,
    reveal: bool = False,
) -> dict[str, Any]:
    """A JSON-ready dict of a message (ISO-8601 datetimes).

    Unless ``reveal``, the recipient is masked and the payload replaced by its size
    (``"<hidden: N bytes>"``). The payload hash is never shown: it is an unkeyed sha256 of
    the recipient and payload, so a short secret in it (an OTP) could be found by guessing.
    ``attempts``, when given, are included as ``"attempts"`` (each naming the provider it
    called), with the message's ``"route"``: the providers they went through (``route``).
    ``"pinned"``: an attempt on its provider may have taken effect, so it never fails over
    (docs/concepts.md, "Failover"). ``"trace_id"``: its OpenTelemetry trace, when the span
    that enqueued it was recorded (docs/operations.md, "Traces").
    """
    recipient = message.recipient
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
        "pinned": bool(message.pinned),
        "next_attempt_at": _iso(message.next_attempt_at),
        "lease_expires_at": _iso(message.lease_expires_at),
        "last_error_code": message.last_error_code,
        "last_error": message.last_error if reveal else _masked(message.last_error, recipient),
        "provider_ref": message.provider_ref,
        "payload": payload,
        "created_at": _iso(message.created_at),
        "updated_at": _iso(message.updated_at),
        "sent_at": _iso(message.sent_at),
        "trace_id": trace_id(message.traceparent),
    }
    if attempts is not None:
        mask_for = None if reveal else recipient
        data = _after(data, "provider", "route", route(message, attempts))
        data["attempts"] = [
            attempt_dict(attempt, recipient=mask_for, provider=message.provider)
            for attempt in attempts
        ]
    return data


def _after(data: dict[str, Any], name: str, new: str, value: Any) -> dict[str, Any]:
    """``data`` with ``new: value`` right after its key ``name``."""
    ordered: dict[str, Any] = {}
    for key, old in data.items():
        ordered[key] = old
        if key == name:
            ordered[new] = value
    return ordered
