"""One delivery attempt for one message: the worker's whole job, as a plain function.

``deliver`` takes the row from ``dispatched`` to ``sending`` with a conditional UPDATE and
commits *before* calling the provider, so that a crash mid-call leaves a ``sending`` row the
sweeper can find. The provider's outcome then decides the next state in one transaction
together with the attempt's log row. A task for a row that is not ``dispatched``, not yet
due, or already taken by another worker does nothing.

Before taking the row, the provider's circuit breaker (``delivery.breaker``) is asked: while
it is open (or half-open with its one probe taken) the row goes back to ``pending`` until the
breaker's next probe time plus up to ``CIRCUIT_JITTER`` s, with code ``CIRCUIT_OPEN`` and no
attempt spent. The call's outcome is then recorded in the breaker.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select, update

from delivery.backoff import compute_backoff
from delivery.breaker import Permit
from delivery.config import Backoff
from delivery.events import Transition, emit
from delivery.models import attempts_table, messages_table, utcnow
from delivery.outcomes import (
    Absent,
    Delivered,
    Found,
    LookupFailed,
    LookupOutcome,
    Outcome,
    Permanent,
    Retryable,
    Undeliverable,
    Unknown,
)
from delivery.policies import UnknownPolicy
from delivery.providers import Envelope
from delivery.service import Service
from delivery.status import Status

__all__ = ["CIRCUIT_JITTER", "CIRCUIT_OPEN", "EXPIRED", "RATE_LIMITED", "Result", "deliver"]

CIRCUIT_OPEN = "CIRCUIT_OPEN"
EXPIRED = "EXPIRED"
RATE_LIMITED = "RATE_LIMITED"
CIRCUIT_JITTER = 1.0


@dataclass(frozen=True, slots=True)
class Result:
    """What the task should do next. ``action``: ``done`` (final state reached), ``retry``
    (re-run after ``delay`` seconds: the row waits as ``dispatched``), ``parked`` (back to the
    outbox as ``pending``; the relay will publish it when due) or ``skip`` (nothing to do)."""

    action: str
    status: str | None = None
    delay: float | None = None
    code: str | None = None
    reason: str | None = None


_COLUMNS = (
    "id",
    "key",
    "channel",
    "provider",
    "recipient",
    "payload",
    "status",
    "attempts",
    "max_attempts",
    "needs_lookup",
    "on_unknown",
    "next_attempt_at",
    "lease_expires_at",
    "expires_at",
    "message_type",
    "created_at",
)

#: What one attempt reads of its message, in one primary-key read.
_ROW = select(*(messages_table.c[name] for name in _COLUMNS))


def deliver(service: Service, message_id: int, key: str) -> Result:
    now = utcnow()
    with service.engine.connect() as conn:
        row = conn.execute(_ROW.where(messages_table.c.id == message_id)).one_or_none()
    if row is None or row.key != key:
        return Result("skip", reason="no such message")
    if row.status != Status.DISPATCHED:
        return Result("skip", status=row.status, reason=f"message is {row.status}")
    early = (row.next_attempt_at - now).total_seconds()
    if early > 0:
        # A duplicate task, or a countdown that fired early: never send before the due time.
        if early < 1.0:
            return Result("retry", status=row.status, delay=early, reason="not due yet")
        return Result("skip", status=row.status, reason="not due yet")
    if row.expires_at is not None and now >= row.expires_at:
        return _expire(service, row.id, row.key, row.provider, row.attempts)
    limiter = service.limiter(row.provider)
    wait = limiter.acquire() if limiter is not None else 0.0
    if wait > 0:
        return _rate_limited(service, row.id, row.provider, row.lease_expires_at, wait)

    breaker = service.breaker(row.provider)
    permit = breaker.allow()
    if not permit.allowed:
        return _circuit_open(service, row.id, row.key, row.provider, row.attempts, permit)

    attempt = row.attempts + 1
    with service.engine.begin() as conn:
        taken = _move(
            conn,
            message_id,
            row.attempts,
            Status.DISPATCHED,
            Status.SENDING,
            attempts=attempt,
            lease_expires_at=now + dt.timedelta(seconds=service.settings.send_lease),
        )
    if not taken:
        breaker.release(permit)
        return Result("skip", reason="taken by another worker")
    emit(Transition(row.id, row.key, row.provider, Status.DISPATCHED, Status.SENDING, attempt))

    provider = service.provider(row.provider)
    envelope = Envelope(row.key, row.channel, row.recipient, dict(row.payload))
    kind = service.settings.types.get(row.message_type or "")
    msg = _Sending(
        row.id,
        row.key,
        row.provider,
        attempt,
        row.max_attempts,
        UnknownPolicy(row.on_unknown),
        kind.backoff if kind is not None and kind.backoff else service.settings.backoff,
        row.created_at,
    )
    if row.needs_lookup:
        started = time.perf_counter()
        found = provider.lookup(envelope)
        if not isinstance(found, Absent):  # absent: the send that follows is recorded instead
            breaker.record(permit, found.kind)
        lookup_result = _after_lookup(service, msg, found, started)
        if lookup_result is not None:
            return lookup_result
    started = time.perf_counter()
    outcome = provider.send(envelope)
    breaker.record(permit, outcome.kind)
    return _after_send(service, msg, outcome, started)


def _expire(service: Service, message_id: int, key: str, provider: str, attempts: int) -> Result:
    """A message past its time-to-live is never sent late: ``dispatched`` -> ``expired``."""
    with service.engine.begin() as conn:
        done = _move(
            conn,
            message_id,
            attempts,
            Status.DISPATCHED,
            Status.EXPIRED,
            lease_expires_at=None,
            last_error_code=EXPIRED,
            last_error="time-to-live passed before it could be sent",
        )
    if not done:
        return Result("skip", reason="taken by another worker")
    emit(
        Transition(
            message_id,
            key,
            provider,
            Status.DISPATCHED,
            Status.EXPIRED,
            attempts,
            "expired",
            EXPIRED,
        )
    )
    return Result("done", Status.EXPIRED, code=EXPIRED)


def _rate_limited(
    service: Service, message_id: int, provider: str, lease: dt.datetime | None, wait: float
) -> Result:
    """Over the provider's rate: come back when a token is there (plus a little jitter so
    that waiting workers do not all return at once). The row stays ``dispatched``; only its
    lease is extended when the wait would outlast it."""
    delay = wait + service.rng.uniform(0.0, min(wait, 1.0))
    now = utcnow()
    if lease is not None and lease < now + dt.timedelta(seconds=delay + 5.0):
        with service.engine.begin() as conn:
            conn.execute(
                update(messages_table)
                .where(
                    messages_table.c.id == message_id,
                    messages_table.c.status == Status.DISPATCHED.value,
                )
                .values(
                    lease_expires_at=now
                    + dt.timedelta(seconds=delay + service.settings.dispatch_lease)
                )
            )
    return Result(
        "retry", Status.DISPATCHED, delay, RATE_LIMITED, f"provider {provider!r} rate limit"
    )


def _circuit_open(
    service: Service, message_id: int, key: str, provider: str, attempts: int, permit: Permit
) -> Result:
    """Park a ``dispatched`` row as ``pending`` until the breaker's next probe (plus jitter),
    without spending an attempt."""
    now = utcnow()
    wait = max(0.0, (permit.retry_at or 0.0) - time.time())
    wait += service.rng.uniform(0.0, CIRCUIT_JITTER)
    due = now + dt.timedelta(seconds=wait)
    reason = (
        f"circuit breaker of provider {provider!r} is {permit.state}; "
        f"next try at {due.isoformat(timespec='seconds')}"
    )
    with service.engine.begin() as conn:
        parked = _move(
            conn,
            message_id,
            attempts,
            Status.DISPATCHED,
            Status.PENDING,
            next_attempt_at=due,
            lease_expires_at=None,
            last_error_code=CIRCUIT_OPEN,
            last_error=reason,
        )
    if not parked:
        return Result("skip", reason="taken by another worker")
    emit(
        Transition(
            message_id,
            key,
            provider,
            Status.DISPATCHED,
            Status.PENDING,
            attempts,
            "circuit_open",
            CIRCUIT_OPEN,
            round(wait, 3),
        )
    )
    return Result("parked", Status.PENDING, wait, CIRCUIT_OPEN, reason)


@dataclass(frozen=True, slots=True)
class _Sending:
    id: int
    key: str
    provider: str
    attempt: int
    max_attempts: int
    policy: UnknownPolicy
    backoff: Backoff
    enqueued_at: dt.datetime


def _log_attempt(
    conn: Connection, msg: _Sending, kind: str, outcome: Outcome | LookupOutcome, started: float
) -> None:
    latency = (time.perf_counter() - started) * 1000.0
    conn.execute(
        insert(attempts_table).values(
            message_id=msg.id,
            number=msg.attempt,
            kind=kind,
            outcome=outcome.kind,
            started_at=utcnow() - dt.timedelta(milliseconds=latency),
            http_status=outcome.http_status,
            latency_ms=round(latency, 3),
            error_code=getattr(outcome, "code", None),
            error=getattr(outcome, "reason", None),
        )
    )


def _move(
    conn: Connection,
    message_id: int,
    seen_attempts: int,
    expected: Status,
    to: Status,
    **values: object,
) -> bool:
    """The one conditional UPDATE of a worker: ``expected`` -> ``to``, only while the row is
    where this worker saw it (status and attempt count). False: someone else moved it."""
    done = conn.execute(
        update(messages_table)
        .where(
            messages_table.c.id == message_id,
            messages_table.c.status == expected.value,
            messages_table.c.attempts == seen_attempts,
        )
        .values(status=to.value, updated_at=utcnow(), **values)
    ).rowcount
    return bool(done)


def _finish(conn: Connection, msg: _Sending, status: Status, **values: object) -> bool:
    """Move the row from ``sending`` (this attempt) to ``status``; False if someone else did."""
    return _move(conn, msg.id, msg.attempt, Status.SENDING, status, **values)


def _after_lookup(
    service: Service, msg: _Sending, found: LookupOutcome, started: float
) -> Result | None:
    """Apply a lookup's answer; ``None`` means the key is absent: go on and send."""
    with service.engine.begin() as conn:
        _log_attempt(conn, msg, "lookup", found, started)
        match found:
            case Found(provider_ref=ref):
                return _sent(conn, msg, ref, "found")
            case Absent():
                conn.execute(
                    update(messages_table)
                    .where(messages_table.c.id == msg.id)
                    .values(needs_lookup=False)
                )
                return None
            case LookupFailed(code=code, reason=reason):
                return _retry_or_stop(
                    service, conn, msg, code, reason, None, Status.UNKNOWN, "lookup_failed"
                )
            case Undeliverable(code=code, reason=reason):
                return _stop(conn, msg, Status.DEAD, code, reason, "undeliverable")
    raise AssertionError(found)


def _after_send(service: Service, msg: _Sending, outcome: Outcome, started: float) -> Result:
    with service.engine.begin() as conn:
        _log_attempt(conn, msg, "send", outcome, started)
        match outcome:
            case Delivered(provider_ref=ref):
                return _sent(conn, msg, ref, "delivered")
            case Permanent(code=code, reason=reason):
                return _stop(conn, msg, Status.DEAD, code, reason, "permanent")
            case Retryable(code=code, reason=reason, retry_after=retry_after):
                return _retry_or_stop(
                    service, conn, msg, code, reason, retry_after, Status.DEAD, "retryable"
                )
            case Unknown(code=code, reason=reason):
                if msg.policy is UnknownPolicy.GIVE_UP:
                    return _stop(conn, msg, Status.UNKNOWN, code, reason, "unknown")
                lookup = msg.policy is UnknownPolicy.LOOKUP
                return _retry_or_stop(
                    service,
                    conn,
                    msg,
                    code,
                    reason,
                    None,
                    Status.UNKNOWN,
                    "unknown",
                    needs_lookup=lookup,
                )
    raise AssertionError(outcome)


def _sent(conn: Connection, msg: _Sending, ref: str | None, outcome: str) -> Result:
    now = utcnow()
    if _finish(
        conn,
        msg,
        Status.SENT,
        provider_ref=ref,
        sent_at=now,
        lease_expires_at=None,
        needs_lookup=False,
        last_error_code=None,
        last_error=None,
    ):
        emit(
            Transition(
                msg.id,
                msg.key,
                msg.provider,
                Status.SENDING,
                Status.SENT,
                msg.attempt,
                outcome,
                enqueued_at=msg.enqueued_at,
            )
        )
        return Result("done", Status.SENT)
    return Result("skip", reason="row changed while sending")


def _stop(
    conn: Connection, msg: _Sending, status: Status, code: str, reason: str, outcome: str
) -> Result:
    if _finish(
        conn, msg, status, lease_expires_at=None, last_error_code=code[:64], last_error=reason
    ):
        emit(
            Transition(
                msg.id, msg.key, msg.provider, Status.SENDING, status, msg.attempt, outcome, code
            )
        )
        return Result("done", status, code=code, reason=reason)
    return Result("skip", reason="row changed while sending")


def _retry_or_stop(
    service: Service,
    conn: Connection,
    msg: _Sending,
    code: str,
    reason: str,
    retry_after: float | None,
    exhausted: Status,
    outcome: str,
    needs_lookup: bool | None = None,
) -> Result:
    if msg.attempt >= msg.max_attempts:
        return _stop(
            conn,
            msg,
            exhausted,
            code,
            f"attempts exhausted ({msg.attempt}/{msg.max_attempts}): {reason}",
            outcome,
        )
    delay = compute_backoff(msg.attempt, msg.backoff, retry_after, service.rng)
    extra = {} if needs_lookup is None else {"needs_lookup": needs_lookup}
    status = _park(
        conn,
        msg.id,
        msg.attempt,
        delay,
        service.settings.max_countdown,
        service.settings.dispatch_lease,
        code=code[:64],
        reason=reason,
        **extra,
    )
    if status is None:
        return Result("skip", reason="row changed while sending")
    emit(
        Transition(
            msg.id,
            msg.key,
            msg.provider,
            Status.SENDING,
            status,
            msg.attempt,
            outcome,
            code,
            round(delay, 3),
        )
    )
    action = "retry" if status is Status.DISPATCHED else "parked"
    return Result(action, status, delay, code, reason)


def _park(
    conn: Connection,
    message_id: int,
    attempt: int,
    delay: float,
    max_countdown: float,
    lease: float,
    *,
    code: str,
    reason: str,
    **values: object,
) -> Status | None:
    """Park a ``sending`` row until ``now + delay``.

    A short wait stays ``dispatched`` (the task re-runs itself with a countdown, visible in
    Flower as a retry; the lease covers the wait, so a lost retry is recovered by the
    sweeper). A long one goes back to the outbox as ``pending``: the broker never holds a
    task longer than ``max_countdown``.
    """
    now = utcnow()
    due = now + dt.timedelta(seconds=delay)
    short = delay <= max_countdown
    status = Status.DISPATCHED if short else Status.PENDING
    lease_until = due + dt.timedelta(seconds=lease) if short else None
    done = _move(
        conn,
        message_id,
        attempt,
        Status.SENDING,
        status,
        next_attempt_at=due,
        lease_expires_at=lease_until,
        last_error_code=code,
        last_error=reason,
        **values,
    )
    return status if done else None
