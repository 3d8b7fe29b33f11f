"""One delivery attempt for one message: the worker's whole job, as a plain function.

``deliver`` takes the row from ``dispatched`` to ``sending`` with a conditional UPDATE and
commits *before* calling the provider (with a lease of ``hold_lease`` s that the worker's lease
keeper renews while the call runs, up to ``send_lease``; see ``delivery.pipeline.leases``),
so that a crash mid-call leaves a ``sending`` row the sweeper finds within seconds. The
provider's outcome then decides the next state in one transaction together with the
attempt's log row. A task for a row that is not ``dispatched``, not yet due, or already
taken by another worker does nothing.

Before taking the row, the provider's circuit breaker (``delivery.guards.breaker``) is asked:
while it is open (or half-open with its one probe taken) the row goes back to ``pending`` until
the breaker's next probe time plus up to ``CIRCUIT_JITTER`` s, with code ``CIRCUIT_OPEN`` and
no attempt spent. The adapter is called through ``delivery.providers.calls`` (any exception or
stray value becomes an outcome, bounded and with the recipient masked); the outcome is then
recorded in the breaker, and applied to the row by ``delivery.pipeline.settle`` with the
breaker's answer (a failed probe gives its attempt back; a failure that leaves the breaker open
is not retried before its next probe time). The answer to the task is a ``Result`` whose
``action`` is one of the closed set ``Action`` (``delivery.pipeline.transitions``).

Due times and leases are compared and written on the database's clock
(``delivery.pipeline.clock``), read in the same SELECT as the row (no round trip of its own).
A batch of messages (``delivery.pipeline.batch``) goes through the same checks with the
helpers below (``ROW``, ``circuit_open``, ``in_flight``). A message whose provider is no
longer configured ends ``dead`` with ``PROVIDER_NOT_CONFIGURED`` without a call. A message
flagged ``needs_lookup`` is looked up first only if its provider has a lookup
(``supports_lookup``); otherwise it is sent again with the same key.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, bindparam, select

from delivery.guards.breaker import Permit, Verdict
from delivery.observability.events import Transition, emit
from delivery.pipeline.clock import read_with_clock
from delivery.pipeline.models import messages_table
from delivery.pipeline.outcomes import Absent, LookupOutcome, Outcome, Retryable, Unknown
from delivery.pipeline.policies import UnknownPolicy
from delivery.pipeline.settle import CIRCUIT_JITTER, after_lookup, after_send, probe_wait
from delivery.pipeline.status import Status
from delivery.pipeline.transitions import Action, Result, Sending, extend_lease, move
from delivery.providers import calls
from delivery.providers.base import Envelope
from delivery.runtime.service import Service

__all__ = [
    "CIRCUIT_JITTER",
    "CIRCUIT_OPEN",
    "EXPIRED",
    "PROVIDER_NOT_CONFIGURED",
    "RATE_LIMITED",
    "ROW",
    "Action",
    "Result",
    "breaker_verdict",
    "circuit_open",
    "deliver",
    "in_flight",
]

CIRCUIT_OPEN = "CIRCUIT_OPEN"
EXPIRED = "EXPIRED"
PROVIDER_NOT_CONFIGURED = "PROVIDER_NOT_CONFIGURED"
RATE_LIMITED = "RATE_LIMITED"


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
ROW = select(*(messages_table.c[name] for name in _COLUMNS))
_ROW_BY_ID = ROW.where(messages_table.c.id == bindparam("message_id"))  # one statement object


def deliver(service: Service, message_id: int, key: str) -> Result:
    """Make one attempt at message ``message_id`` (if it is still ``key``'s and due) and
    say what its task does next (``Result.action``, one of ``Action``)."""
    with service.autocommit.connect() as conn:
        rows, now = read_with_clock(conn, _ROW_BY_ID, {"message_id": message_id})
    row = rows[0] if rows else None
    if row is None or row.key != key:
        return Result(Action.SKIP, reason="no such message")
    if row.status != Status.DISPATCHED:
        return Result(Action.SKIP, status=row.status, reason=f"message is {row.status}")
    if row.provider not in service.settings.providers:
        return _not_configured(service, row)
    early = (row.next_attempt_at - now).total_seconds()
    if early > 0:
        # A duplicate task, or a countdown that fired early: never send before the due time.
        if early < 1.0:
            return Result(Action.RETRY, status=row.status, delay=early, reason="not due yet")
        return Result(Action.SKIP, status=row.status, reason="not due yet")
    if row.expires_at is not None and now >= row.expires_at:
        return _expire(service, row)
    limiter = service.limiter(row.provider)
    wait = limiter.acquire() if limiter is not None else 0.0
    if wait > 0:
        return _rate_limited(service, row, wait, now)

    breaker = service.breaker(row.provider)
    permit = breaker.allow()
    if not permit.allowed:
        return circuit_open(service, row, permit, now)

    attempt = row.attempts + 1
    with service.autocommit.connect() as conn:  # one UPDATE, committed when it returns (G2)
        taken = move(
            conn,
            message_id,
            row.attempts,
            Status.DISPATCHED,
            Status.SENDING,
            attempts=attempt,
            # Short: the worker renews it while the call runs, up to send_lease after this
            # take (delivery.pipeline.leases); a killed worker's send comes back in seconds.
            lease_expires_at=now + dt.timedelta(seconds=service.settings.hold_lease),
        )
    if not taken:
        breaker.release(permit)
        return Result(Action.SKIP, reason="taken by another worker")
    emit(Transition(row.id, row.key, row.provider, Status.DISPATCHED, Status.SENDING, attempt))

    provider = service.provider(row.provider)
    envelope = Envelope(row.key, row.channel, row.recipient, dict(row.payload))
    msg = in_flight(service, row, attempt)
    # A provider that cannot be asked (pigeon, webhooks) is sent again with the same key.
    if row.needs_lookup and getattr(provider, "supports_lookup", True):
        started = time.perf_counter()
        found = calls.lookup(provider, envelope)
        if not isinstance(found, Absent):  # absent: the send that follows is recorded instead
            breaker.record(permit, breaker_verdict(found))
        lookup_result = after_lookup(service, msg, found, started)
        if lookup_result is not None:
            return lookup_result
    started = time.perf_counter()
    outcome = calls.send(provider, envelope)
    recorded = breaker.record(permit, breaker_verdict(outcome))
    return after_send(service, msg, outcome, started, recorded)


def in_flight(service: Service, row: Row[Any], attempt: int) -> Sending:
    """The frozen description of ``row`` taken for attempt number ``attempt``."""
    kind = service.settings.types.get(row.message_type or "")
    return Sending(
        row.id,
        row.key,
        row.provider,
        attempt,
        row.max_attempts,
        UnknownPolicy(row.on_unknown),
        kind.backoff if kind is not None and kind.backoff else service.settings.backoff,
        row.created_at,
        getattr(service.provider(row.provider), "in_progress_wait", None),
    )


def breaker_verdict(outcome: Outcome | LookupOutcome) -> Verdict:
    """What one outcome says about the provider's health (``delivery.guards.breaker``):
    unknown (no answer after the request was written) and retryable answers are failures,
    except a 409 ``IDEMPOTENCY_IN_PROGRESS`` (the provider is up, busy with our earlier
    attempt); a delivery or a lookup that answered (found, absent, or found undeliverable)
    is a success; a permanent answer (4xx) and a failed lookup are neutral."""
    if isinstance(outcome, Unknown):
        return Verdict.FAILURE
    if isinstance(outcome, Retryable):
        in_progress = outcome.code == "IDEMPOTENCY_IN_PROGRESS"
        return Verdict.NEUTRAL if in_progress else Verdict.FAILURE
    if outcome.kind in ("delivered", "found", "absent", "undeliverable"):
        return Verdict.SUCCESS
    return Verdict.NEUTRAL


@dataclass(frozen=True, slots=True)
class _Leave:
    """A ``dispatched`` row leaving without an attempt: where to, and what to log and store."""

    to: Status
    outcome: str
    code: str
    reason: str
    delay: float | None = None


def _leave_dispatched(service: Service, row: Row[Any], leave: _Leave, **values: object) -> bool:
    """Move a row this worker never took out of ``dispatched`` (no attempt spent) and emit the
    transition; False if someone else moved it first."""
    with service.engine.begin() as conn:
        done = move(
            conn,
            row.id,
            row.attempts,
            Status.DISPATCHED,
            leave.to,
            lease_expires_at=None,
            last_error_code=leave.code,
            last_error=leave.reason,
            **values,
        )
    if done:
        emit(
            Transition(
                row.id,
                row.key,
                row.provider,
                Status.DISPATCHED,
                leave.to,
                row.attempts,
                leave.outcome,
                leave.code,
                leave.delay,
            )
        )
    return done


def _expire(service: Service, row: Row[Any]) -> Result:
    """A message past its time-to-live is never sent late: ``dispatched`` -> ``expired``."""
    reason = "time-to-live passed before it could be sent"
    if not _leave_dispatched(service, row, _Leave(Status.EXPIRED, "expired", EXPIRED, reason)):
        return Result(Action.SKIP, reason="taken by another worker")
    return Result(Action.DONE, Status.EXPIRED, code=EXPIRED)


def _not_configured(service: Service, row: Row[Any]) -> Result:
    """A message whose provider is no longer configured can never be sent: it ends ``dead``
    with ``PROVIDER_NOT_CONFIGURED`` (redrive it once the provider is back) instead of
    cycling between ``dispatched`` and ``pending``."""
    reason = f"provider {row.provider!r} is not configured (DELIVERY_CONFIG [providers])"
    leave = _Leave(Status.DEAD, "permanent", PROVIDER_NOT_CONFIGURED, reason)
    if not _leave_dispatched(service, row, leave):
        return Result(Action.SKIP, reason="taken by another worker")
    return Result(Action.DONE, Status.DEAD, code=PROVIDER_NOT_CONFIGURED, reason=reason)


def _rate_limited(service: Service, row: Row[Any], wait: float, now: dt.datetime) -> Result:
    """Over the provider's rate: come back when a token is there (plus a little jitter so
    that waiting workers do not all return at once). The row stays ``dispatched``; only its
    lease is extended when the wait would outlast it."""
    provider, lease = row.provider, row.lease_expires_at
    delay = wait + service.rng.uniform(0.0, min(wait, 1.0))
    if lease is not None and lease < now + dt.timedelta(seconds=delay + 5.0):
        until = now + dt.timedelta(seconds=delay + service.settings.hold_lease)
        with service.engine.begin() as conn:
            extend_lease(conn, row.id, row.attempts, until)
    return Result(
        Action.RETRY, Status.DISPATCHED, delay, RATE_LIMITED, f"provider {provider!r} rate limit"
    )


def circuit_open(service: Service, row: Row[Any], permit: Permit, now: dt.datetime) -> Result:
    """Park a ``dispatched`` row as ``pending`` until the breaker's next probe (plus jitter),
    without spending an attempt."""
    provider = row.provider
    wait = probe_wait(service, permit.retry_at)
    due = now + dt.timedelta(seconds=wait)
    reason = (
        f"circuit breaker of provider {provider!r} is {permit.state}; "
        f"next try at {due.isoformat(timespec='seconds')}"
    )
    leave = _Leave(Status.PENDING, "circuit_open", CIRCUIT_OPEN, reason, round(wait, 3))
    if not _leave_dispatched(service, row, leave, next_attempt_at=due):
        return Result(Action.SKIP, reason="taken by another worker")
    return Result(Action.PARKED, Status.PENDING, wait, CIRCUIT_OPEN, reason)
