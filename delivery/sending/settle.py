"""What one attempt's outcome does to its message, in one transaction with the attempt's row.

``after_send`` matches on the closed set of outcomes (``delivery.core.outcomes``):

- ``Delivered``: ``sent``, with the provider's reference.
- ``Permanent``: ``dead``, with its code and reason.
- ``Retryable``: waits (backoff, or the provider's Retry-After) and is sent again with the
  same key; ``dead`` once its attempts are spent. ``IDEMPOTENCY_IN_PROGRESS`` (our own earlier
  attempt is still running at the provider) waits out the provider's budget and spends no
  attempt: it never ends ``dead``.
- ``Unknown``: the message's policy: ``give_up`` -> ``unknown``; ``retry`` waits and sends
  again; ``lookup`` waits and asks the provider first; ``unknown`` once its attempts are spent.

The breaker's answer to the call (``Recorded``) weighs on both retries (G5): a failed call
after which the breaker is open waits until its next probe time, and a failed half-open probe
gives its attempt back (docs/concepts.md, "Circuit breaker").

``after_lookup`` does the same for a lookup: ``Found`` -> ``sent``; ``Absent`` -> renew the
lease, fenced on this attempt, and go on and send; ``LookupFailed`` -> wait and look again
(``unknown`` once the attempts are spent); ``Undeliverable`` -> ``dead`` with the provider's
code. Every move is a transition of ``delivery.transitions.worker``; a message that ends
``dead`` is told to the app's outcome hooks once its transaction committed
(``tell_outcomes_after``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlalchemy import Connection

from delivery.core import outcomes
from delivery.core.backoff import compute_backoff
from delivery.core.clock import db_now
from delivery.core.policies import UnknownPolicy
from delivery.core.status import Status
from delivery.guards import failover
from delivery.guards.breaker import Recorded
from delivery.runtime.service import Service
from delivery.transitions import (
    Action,
    Failure,
    Result,
    Sending,
    in_progress,
    tell_outcomes_after,
)
from delivery.transitions.attempts import log_attempt, ms_since
from delivery.transitions.failover import FAILOVER, fail_over
from delivery.transitions.worker import Accepted, finish_sent, park, renew, stop

__all__ = [
    "CIRCUIT_JITTER",
    "Sent",
    "after_lookup",
    "after_send",
    "after_sends",
    "failed_over",
    "probe_wait",
]

CIRCUIT_JITTER = 1.0
"""Up to this many seconds are added to a wait for the breaker's next probe time."""

_CHANGED = Result(Action.SKIP, reason="row changed while sending")
_NO_BREAKER = Recorded()


def after_lookup(
    service: Service, msg: Sending, found: outcomes.LookupOutcome, started: float
) -> Result | None:
    """Apply a lookup's answer; ``None`` means the key is absent: go on and send."""
    if isinstance(found, outcomes.Found):
        return _sent(service, [(msg, "lookup", found, ms_since(started))])[msg.id]
    with tell_outcomes_after(), service.engine.begin() as conn:
        log_attempt(conn, msg, "lookup", found, started)
        match found:
            case outcomes.Absent():
                # Ours still? The lookup may have outlived the lease: the row may have been
                # recovered and taken by another worker. Renew the lease (fenced on this
                # attempt) before sending, or send nothing.
                lease = db_now(conn) + dt.timedelta(seconds=service.settings.send_lease)
                return None if renew(conn, msg, lease) else _CHANGED
            case outcomes.LookupFailed(code=code, reason=reason):
                failure = Failure(code, reason, "lookup_failed", Status.UNKNOWN)
                return _retry_or_stop(service, conn, msg, failure)
            case outcomes.Undeliverable(code=code, reason=reason):
                return _stop(conn, msg, Failure(code, reason, "undeliverable", Status.DEAD))
    raise AssertionError(found)


@dataclass(frozen=True, slots=True)
class Sent:
    """A call made: the message, its outcome, when the call started (``perf_counter``) and
    what the breaker answered when it was recorded."""

    msg: Sending
    outcome: outcomes.Outcome
    started: float
    breaker: Recorded = _NO_BREAKER


def after_sends(service: Service, calls: Sequence[Sent]) -> dict[int, Result]:
    """Apply the outcome of each call (the table in the module docstring), by message id:
    every delivery in one statement (``transitions.finish_sent``), each other outcome in its
    own transaction with its attempt's row."""
    results = _sent(
        service,
        [
            (c.msg, "send", c.outcome, ms_since(c.started))
            for c in calls
            if isinstance(c.outcome, outcomes.Delivered)
        ],
    )
    for c in calls:
        if not isinstance(c.outcome, outcomes.Delivered):
            results[c.msg.id] = _after_failure(service, c)
    return results


def _sent(service: Service, accepted: Sequence[Accepted]) -> dict[int, Result]:
    """``sent`` for every accepted call, in one statement (autocommit on PostgreSQL)."""
    if not accepted:
        return {}
    postgresql = service.engine.dialect.name == "postgresql"
    with service.autocommit.connect() if postgresql else service.engine.begin() as conn:
        moved = finish_sent(conn, accepted)
    sent = {msg.id: Result(Action.DONE, Status.SENT, provider=msg.provider) for msg, *_ in accepted}
    return {msg_id: result if msg_id in moved else _CHANGED for msg_id, result in sent.items()}


def after_send(
    service: Service,
    msg: Sending,
    outcome: outcomes.Outcome,
    started: float,
    breaker: Recorded = _NO_BREAKER,
) -> Result:
    """``after_sends`` for one call; ``breaker``: what the provider's breaker answered when
    the outcome was recorded."""
    return after_sends(service, [Sent(msg, outcome, started, breaker)])[msg.id]


def _after_failure(service: Service, call: Sent) -> Result:
    msg, outcome, breaker = call.msg, call.outcome, call.breaker
    with tell_outcomes_after(), service.engine.begin() as conn:
        log_attempt(conn, msg, "send", outcome, call.started)
        match outcome:
            case outcomes.Permanent(code=code, reason=reason):
                return _stop(conn, msg, Failure(code, reason, "permanent", Status.DEAD))
            case outcomes.Retryable() if in_progress(outcome):
                return _wait_in_progress(service, conn, msg, outcome)
            case outcomes.Retryable(code=code, reason=reason, retry_after=retry_after):
                pins = not outcomes.created_nothing(outcome)
                failure = Failure(code, reason, "retryable", Status.DEAD, retry_after, pins=pins)
                limited = outcome.http_status == 429
                why: failover.Reason = "rate_limited" if limited else "unavailable"
                return _retry_or_stop(service, conn, msg, failure, breaker, why=why)
            case outcomes.Unknown(code=code, reason=reason):
                if msg.policy is UnknownPolicy.GIVE_UP:
                    return _stop(conn, msg, Failure(code, reason, "unknown", Status.UNKNOWN))
                lookup = msg.policy is UnknownPolicy.LOOKUP
                failure = Failure(code, reason, "unknown", Status.UNKNOWN, needs_lookup=lookup)
                return _retry_or_stop(service, conn, msg, failure, breaker)
    raise AssertionError(outcome)


def _stop(conn: Connection, msg: Sending, failure: Failure) -> Result:
    """End the message in ``failure.final`` (dead or unknown)."""
    if stop(conn, msg, failure):
        final, code, reason = failure.final, failure.code, failure.reason
        return Result(Action.DONE, final, code=code, reason=reason, provider=msg.provider)
    return _CHANGED


def _retry_or_stop(
    service: Service,
    conn: Connection,
    msg: Sending,
    failure: Failure,
    breaker: Recorded = _NO_BREAKER,
    *,
    why: failover.Reason = "unavailable",
) -> Result:
    """Wait and try again with the same key, or stop once the attempts are spent; a failed
    probe gives its attempt back (the module docstring). After a call that created nothing
    the message may fail over instead (``why``: what kept it from its provider)."""
    if msg.attempt >= msg.max_attempts and not breaker.probe_failed:
        spent = f"attempts exhausted ({msg.attempt}/{msg.max_attempts}): {failure.reason}"
        return _stop(conn, msg, replace(failure, reason=spent))
    delay = compute_backoff(msg.attempt, msg.backoff, failure.retry_after, service.rng)
    if breaker.retry_at is not None:  # the breaker is open: sooner it would only be parked
        delay = max(delay, probe_wait(service, breaker.retry_at))
    now = db_now(conn)
    if not failure.pins:  # it created nothing: may the message move on instead of waiting?
        if breaker.retry_at is not None:
            why = "circuit_open"
        moved = _fail_over(service, conn, msg, failure, why, breaker=breaker, at=(now, delay))
        if moved is not None:
            return moved
    if breaker.probe_failed:
        given_back = f"circuit breaker probe, attempt given back: {failure.reason}"
        failure = replace(failure, reason=given_back)
        return _park(service, conn, msg, (now, delay), failure, max_attempts=msg.max_attempts + 1)
    return _park(service, conn, msg, (now, delay), failure)


def _fail_over(
    service: Service,
    conn: Connection,
    msg: Sending,
    failure: Failure,
    reason: failover.Reason,
    *,
    breaker: Recorded,
    at: tuple[dt.datetime, float],
) -> Result | None:
    """After a call that created nothing, the message moves to the next provider of its route,
    due now, when waiting ``delay`` s (``at``: the database's time now, and the delay) for
    its own would take too long (the failover rule: ``delivery.guards.failover``); None: it
    stays. A failed probe's attempt is given back."""
    now, delay = at
    # the breaker opened on this call: an outage, like a refusal (None); else the wait
    next_try = None if breaker.retry_at is not None else now + dt.timedelta(seconds=delay)
    to = failover.target(service.settings, msg, next_try, service.breaker_state)
    if to is None:
        return None
    text = f"failed over from {msg.provider!r} to {to!r}: {failure.reason}"
    if not fail_over(conn, msg, to, (reason, text), now, spent=not breaker.probe_failed):
        return _CHANGED
    return failed_over(to, text)


def failed_over(to: str, text: str) -> Result:
    """What the task does once its message failed over to ``to``: nothing; the relay
    publishes it again, due now, for its new provider."""
    return Result(Action.PARKED, Status.PENDING, 0.0, FAILOVER, text, to)


def probe_wait(service: Service, retry_at: float | None) -> float:
    """Seconds until the breaker's next probe time ``retry_at`` (epoch seconds; None: now),
    plus up to ``CIRCUIT_JITTER`` s so that the messages waiting for it do not all come back
    at once."""
    return max(0.0, (retry_at or 0.0) - time.time()) + service.rng.uniform(0.0, CIRCUIT_JITTER)


def _wait_in_progress(
    service: Service, conn: Connection, msg: Sending, outcome: outcomes.Retryable
) -> Result:
    """Our own earlier attempt is still running at the provider (409 in progress): wait it out
    (Retry-After, else the provider's own budget, else backoff) and ask again with the same
    key. The attempt is given back (``max_attempts`` + 1), so this never ends ``dead``."""
    wait = outcome.retry_after if outcome.retry_after is not None else msg.in_progress_wait
    if wait is None:
        wait = compute_backoff(msg.attempt, msg.backoff, None, service.rng)
    failure = Failure(outcome.code, outcome.reason, "in_progress", Status.DEAD, wait)
    when = (db_now(conn), wait)
    return _park(service, conn, msg, when, failure, max_attempts=msg.max_attempts + 1)


def _park(
    service: Service,
    conn: Connection,
    msg: Sending,
    at: tuple[dt.datetime, float],
    failure: Failure,
    **values: object,
) -> Result:
    """Park ``msg`` ``at`` (the database's time now, and the delay from it) for ``failure``."""
    now, delay = at
    status = park(conn, msg, delay, service.settings, failure, now=now, **values)
    if status is None:
        return _CHANGED
    action = Action.RETRY if status is Status.DISPATCHED else Action.PARKED
    return Result(action, status, delay, failure.code, failure.reason)
