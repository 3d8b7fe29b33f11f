"""One attempt at one message, from the row its task read: ``check``, ``admit`` (the breaker
and the take) and ``call``, each step only once the previous one let the message through
(docs/concepts.md, "A backlog travels in batches"):

0. ``suppressed``: the task's rows whose recipient is on the channel's suppression list
   (``delivery.guards.suppression``; one statement for the task, none while the list is
   empty) end ``suppressed``, never sent, unless their message type says ``suppress = false``;
1. ``check``: its provider must still be configured (else ``dead``,
   ``PROVIDER_NOT_CONFIGURED``), it must be due and within its time-to-live (else ``expired``);
2. ``check``: the provider's rate limit: over it, the row stays ``dispatched`` and the task
   comes back when a token is there, or fails over if that is too long for it;
3. ``admit``: the provider's circuit breaker, asked only when the send can start at once:
   refused, the row goes back to ``pending`` until the next probe time, ``CIRCUIT_OPEN``, no
   attempt spent, or fails over (``delivery.guards.failover``), due now;
4. ``admit``: the take, ``dispatched`` -> ``sending`` in one fenced UPDATE in autocommit,
   durable *before* a request leaves (G2), with a lease of ``hold_lease`` s that the lease
   keeper renews. The first wave also takes the task's later rows of every provider whose
   breaker let it through (taken ahead); such a row still asks the breaker when its turn
   comes, and is given back if it refuses or if its call could no longer end within its lease
   (``SEND_LATE``);
5. ``call``: the lookup first if the row ``needs_lookup`` and its provider supports one, then
   the send (``delivery.providers.calls``), recorded in the breaker.

Due times and leases are compared and written on the database's clock, read with the rows
(``delivery.core.clock``) and carried forward by this host's monotonic clock.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Row

from delivery.core.outcomes import Absent, LookupOutcome, Outcome, Retryable, Unknown
from delivery.core.policies import UnknownPolicy
from delivery.core.status import Status
from delivery.guards import failover
from delivery.guards.breaker import Permit, Verdict
from delivery.guards.failover import BreakerState
from delivery.observability import tracing
from delivery.providers import calls
from delivery.providers.base import Envelope
from delivery.runtime.service import Service
from delivery.sending.settle import Sent, after_lookup, failed_over, probe_wait
from delivery.transitions import Action, Result, Sending, tell_outcomes_after
from delivery.transitions.failover import fail_over
from delivery.transitions.recovery import EXPIRED
from delivery.transitions.worker import Leave, extend_lease, give_back, leave, take

__all__ = [
    "CIRCUIT_OPEN",
    "EXPIRED",
    "PROVIDER_NOT_CONFIGURED",
    "RATE_LIMITED",
    "SEND_LATE",
    "SUPPRESSED",
    "Admitted",
    "Clock",
    "Entry",
    "Taken",
    "admit",
    "breaker_verdict",
    "call",
    "check",
    "entry_id",
    "entry_row",
    "suppress",
    "suppressed",
]

CIRCUIT_OPEN = "CIRCUIT_OPEN"
PROVIDER_NOT_CONFIGURED = "PROVIDER_NOT_CONFIGURED"
RATE_LIMITED = "RATE_LIMITED"
SEND_LATE = "SEND_LATE"
SUPPRESSED = "SUPPRESSED"

_TAKEN = Result(Action.SKIP, reason="taken by another worker")


@dataclass(frozen=True, slots=True)
class Clock:
    """The database's time as read with the rows (``at``), carried forward on this host's
    monotonic clock from the moment it was read (``read``)."""

    at: dt.datetime
    read: float

    def now(self) -> dt.datetime:
        return self.at + dt.timedelta(seconds=time.monotonic() - self.read)


@dataclass(frozen=True, slots=True)
class Taken:
    """A row taken for its attempt (``msg``); ``start_by``: the last moment (``time.monotonic``)
    its call may start and still end within its lease; ``permit``: its breaker permit, once the
    breaker let its call start (``None``: taken ahead, waiting for a send slot)."""

    row: Row[Any]
    msg: Sending
    start_by: float
    permit: Permit | None = None


#: A row of the task not yet admitted: as read (not taken yet), or taken ahead.
Entry = Row[Any] | Taken


def entry_row(entry: Entry) -> Row[Any]:
    """The row an entry is about, taken ahead or not."""
    return entry.row if isinstance(entry, Taken) else entry


def entry_id(entry: Entry) -> int:
    return int(entry_row(entry).id)


def suppressed(service: Service, rows: Sequence[Row[Any]]) -> set[int]:
    """Step 0: the ids of ``rows`` whose recipient is on their channel's suppression list,
    but for message types with ``suppress = false``."""
    lists = service.suppressions
    if not rows or not lists.active():
        return set()
    types = service.settings.types
    subject = [
        row for row in rows if (kind := types.get(row.message_type or "")) is None or kind.suppress
    ]
    with service.autocommit.connect() as conn:
        places = lists.listed(conn, [(row.channel, row.recipient) for row in subject])
    return {subject[place].id for place in places}


def suppress(service: Service, row: Row[Any]) -> Result:
    """A suppressed recipient's message is never sent: ``dispatched`` -> ``suppressed``."""
    reason = f"its recipient is on the {row.channel} suppression list"
    why = Leave(Status.SUPPRESSED, "suppressed", SUPPRESSED, reason)
    return _not_sent(service, row, why, Result(Action.DONE, Status.SUPPRESSED, code=SUPPRESSED))


def check(service: Service, row: Row[Any], clock: Clock) -> Result | None:
    """Steps 1 and 2 for the ``dispatched`` ``row``: ``None`` when it may go on to its
    breaker, else the ``Result`` of a message that is not sent now."""
    now = clock.now()
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
        why = f"provider {row.provider!r} rate limit: a token in {wait:.3g} s"
        moved = _fail_over(service, row, "rate_limited", why, wait=wait, now=now)
        return moved or _rate_limited(service, row, wait, now)
    return None


@dataclass(slots=True)
class Admitted:
    """What ``admit`` decided: the ``Result`` of each row that is done for now (parked, given
    back, or moved by someone else), the sends that start now, and the rows taken ahead."""

    results: dict[int, Result]
    sends: list[Taken]
    ahead: dict[int, Taken]


def admit(
    service: Service, wave: Sequence[Entry], clock: Clock, ahead: Sequence[Entry] = ()
) -> Admitted:
    """Steps 3 and 4 for ``wave``, the sends that start now (one per free send slot, so that a
    permit is never held by a send that waits). The breaker is asked once per provider for its
    rows of the wave (in half-open, the first is the probe); the rows it lets through are taken
    in one committed UPDATE, together with the rows of ``ahead`` (the task's later rows) of
    those providers. A row someone else moved meanwhile is not sent."""
    results: dict[int, Result] = {}
    allowed: list[tuple[Entry, Permit]] = []
    late: list[Taken] = []
    healthy: set[str] = set()
    by_provider: dict[str, list[Entry]] = {}
    for entry in wave:
        by_provider.setdefault(entry_row(entry).provider, []).append(entry)
    now = clock.now()
    state = functools.cache(service.breaker_state)  # a failover target's, once per admit
    for provider, mine in by_provider.items():
        breaker = service.breaker(provider)
        for entry, permit in zip(mine, breaker.allow_many(len(mine)), strict=True):
            if not permit.allowed:
                results[entry_id(entry)] = _circuit_open(service, entry, permit, now, state)
            elif isinstance(entry, Taken) and time.monotonic() > entry.start_by:
                breaker.release(permit)
                late.append(entry)
            else:
                allowed.append((entry, permit))
                healthy.add(provider)
    sends = [replace(e, permit=p) for e, p in allowed if isinstance(e, Taken)]
    fresh = [(e, p) for e, p in allowed if not isinstance(e, Taken)]
    later = [e for e in ahead if not isinstance(e, Taken) and e.provider in healthy]
    taken: dict[int, Taken] = {}
    if fresh or later:
        taken = _take(service, [e for e, _ in fresh] + later, clock)
        for row, permit in fresh:
            if row.id in taken:
                sends.append(replace(taken[row.id], permit=permit))
            else:
                service.breaker(row.provider).release(permit)
                results[row.id] = _TAKEN
        results |= {row.id: _TAKEN for row in later if row.id not in taken}
    for t in late:
        results[t.row.id] = _too_late(service, t, now)
    return Admitted(results, sends, {row.id: taken[row.id] for row in later if row.id in taken})


def _take(service: Service, rows: Sequence[Row[Any]], clock: Clock) -> dict[int, Taken]:
    """``dispatched`` -> ``sending`` for ``rows`` in one UPDATE, committed when it returns
    (G2): the rows taken, by id."""
    settings = service.settings
    # Short: the worker renews it while the task holds it, up to send_lease after this take
    # (delivery.sending.leases), every hold_lease / 3 s; so it surely lasts until
    # send_lease - hold_lease / 3 after it (timed from before the statement: never later than
    # the database's). A killed worker's rows come back in seconds.
    lease = clock.now() + dt.timedelta(seconds=settings.hold_lease)
    lasts = time.monotonic() + settings.send_lease - settings.hold_lease / 3
    with service.autocommit.connect() as conn:
        ids = take(conn, rows, lease)
    return {
        row.id: Taken(
            row,
            _in_flight(service, row, row.attempts + 1),
            lasts - settings.providers[row.provider].timeouts.total,
        )
        for row in rows
        if row.id in ids
    }


def call(service: Service, taken: Taken) -> Result | Sent:
    """Step 5: the lookup if the row needs one, then the send, recorded in the breaker: the
    call made (``Sent``, to settle), or the ``Result`` its lookup settled."""
    row, msg, permit = taken.row, taken.msg, taken.permit
    assert permit is not None, "admit gives every send its permit"
    breaker = service.breaker(row.provider)
    provider = service.provider(row.provider)
    envelope = Envelope(row.key, row.channel, row.recipient, dict(row.payload))
    with tracing.calling(row.id, row.provider):  # its attempt span, current
        # A provider that cannot be asked (pigeon, webhooks) is sent again with the same key.
        if row.needs_lookup and getattr(provider, "supports_lookup", True):
            started = time.perf_counter()
            found = calls.lookup(provider, envelope)
            if not isinstance(found, Absent):  # absent: the send that follows is recorded
                breaker.record(permit, breaker_verdict(found))
            settled = after_lookup(service, msg, found, started)
            if settled is not None:
                return settled
            msg = replace(msg, pinned=False)  # absent: nothing there (``renew`` unpinned it)
        started = time.perf_counter()
        outcome = calls.send(provider, envelope)
    return Sent(msg, outcome, started, breaker.record(permit, breaker_verdict(outcome)))


def _in_flight(service: Service, row: Row[Any], number: int) -> Sending:
    """The frozen description of ``row`` taken for attempt number ``number``."""
    kind = service.settings.types.get(row.message_type or "")
    return Sending(
        row.id,
        row.key,
        row.provider,
        number,
        row.max_attempts,
        UnknownPolicy(row.on_unknown),
        kind.backoff if kind is not None and kind.backoff else service.settings.backoff,
        row.created_at,
        getattr(service.provider(row.provider), "in_progress_wait", None),
        row.message_type,
        row.channel,
        row.pinned,
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


def _not_sent(
    service: Service, entry: Entry, why: Leave, result: Result, due: dt.datetime | None = None
) -> Result:
    """``entry`` leaves for ``why.to`` without a call (``leave``; ``give_back`` if taken ahead),
    due at ``due`` if given: ``result``, or ``_TAKEN`` if someone else moved it first. Its one
    statement commits at once: a ``suppressed`` or ``dead`` end is told to the outcome hooks."""
    with tell_outcomes_after(), service.autocommit.connect() as conn:
        if isinstance(entry, Taken):
            assert due is not None, "a row given back is due again"
            moved = give_back(conn, entry.msg, why, due)
        else:
            moved = leave(conn, entry, why, **({} if due is None else {"next_attempt_at": due}))
    return result if moved else _TAKEN


def _expire(service: Service, row: Row[Any]) -> Result:
    """A message past its time-to-live is never sent late: ``dispatched`` -> ``expired``."""
    why = Leave(Status.EXPIRED, "expired", EXPIRED, "time-to-live passed before it could be sent")
    return _not_sent(service, row, why, Result(Action.DONE, Status.EXPIRED, code=EXPIRED))


def _not_configured(service: Service, row: Row[Any]) -> Result:
    """A message whose provider is no longer configured can never be sent: it ends ``dead``
    with ``PROVIDER_NOT_CONFIGURED`` (redrive it once the provider is back) instead of
    cycling between ``dispatched`` and ``pending``."""
    reason = f"provider {row.provider!r} is not configured (DELIVERY_CONFIG [providers])"
    why = Leave(Status.DEAD, "permanent", PROVIDER_NOT_CONFIGURED, reason)
    dead = Result(Action.DONE, Status.DEAD, code=PROVIDER_NOT_CONFIGURED, reason=reason)
    return _not_sent(service, row, why, dead)


def _rate_limited(service: Service, row: Row[Any], wait: float, now: dt.datetime) -> Result:
    """Over the provider's rate: come back when a token is there (plus a little jitter so
    that waiting workers do not all return at once). The row stays ``dispatched``; only its
    lease is extended when the wait would outlast it."""
    provider, lease = row.provider, row.lease_expires_at
    delay = wait + service.rng.uniform(0.0, min(wait, 1.0))
    if lease is not None and lease < now + dt.timedelta(seconds=delay + 5.0):
        until = now + dt.timedelta(seconds=delay + service.settings.hold_lease)
        with service.autocommit.connect() as conn:
            extend_lease(conn, row.id, row.attempts, until)
    return Result(
        Action.RETRY, Status.DISPATCHED, delay, RATE_LIMITED, f"provider {provider!r} rate limit"
    )


def _circuit_open(
    service: Service, entry: Entry, permit: Permit, now: dt.datetime, state: BreakerState
) -> Result:
    """Park a row the breaker refused as ``pending`` until the breaker's next probe (plus
    jitter), without spending an attempt (a row taken ahead is given back); or it fails over
    (``state``: the breakers of its route, read once per ``admit``)."""
    row = entry_row(entry)
    wait = probe_wait(service, permit.retry_at)
    due = now + dt.timedelta(seconds=wait)
    refused = f"circuit breaker of provider {row.provider!r} is {permit.state}"
    moved = _fail_over(service, entry, "circuit_open", refused, wait=None, now=now, state=state)
    if moved is not None:
        return moved
    reason = f"{refused}; next try at {due.isoformat(timespec='seconds')}"
    why = Leave(Status.PENDING, "circuit_open", CIRCUIT_OPEN, reason, round(wait, 3))
    parked = Result(Action.PARKED, Status.PENDING, wait, CIRCUIT_OPEN, reason)
    return _not_sent(service, entry, why, parked, due)


def _fail_over(
    service: Service,
    entry: Entry,
    reason: failover.Reason,
    why: str,
    *,
    wait: float | None,
    now: dt.datetime,
    state: BreakerState | None = None,
) -> Result | None:
    """``entry``, not called for (its breaker refuses it: ``wait`` None; or its rate limit
    would make it wait ``wait`` s), moves to the next provider of its route, due now, if the
    failover rule lets it (``delivery.guards.failover``; taken ahead: attempt given back)."""
    row, next_try = entry_row(entry), None if wait is None else now + dt.timedelta(seconds=wait)
    to = failover.target(service.settings, row, next_try, state or service.breaker_state)
    if to is None:
        return None
    text = f"failed over from {row.provider!r} to {to!r}: {why}"
    with tell_outcomes_after(), service.autocommit.connect() as conn:
        message = entry.msg if isinstance(entry, Taken) else row
        moved = fail_over(conn, message, to, (reason, text), now, spent=False)
    return failed_over(to, text) if moved else _TAKEN


def _too_late(service: Service, taken: Taken, now: dt.datetime) -> Result:
    """A row taken ahead too late for its call to end within its lease (a slow provider held
    every send slot): given back, due now, not left to the sweeper's ``on_unknown``."""
    reason = "its call could not start in time to end within its lease; not made"
    why = Leave(Status.PENDING, "send_late", SEND_LATE, reason, 0.0)
    parked = Result(Action.PARKED, Status.PENDING, 0.0, SEND_LATE, reason)
    return _not_sent(service, taken, why, parked, now)
