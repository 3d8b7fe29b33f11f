"""Many messages in one worker task: the path a backlog takes (issue 13).

``deliver_many`` makes one attempt at each message of a batch (``(id, key)`` pairs, what a
``delivery.deliver_batch`` task carries) with the guarantees of ``sender.deliver`` and a
fraction of its commits:

1. One SELECT reads every row of the batch and the database's clock.
2. Each row goes through the single path's checks. A row that is not plainly ready (not
   ``dispatched``, not ours, not due, expired, its provider gone, to be looked up first, or
   of a provider with a rate limit) is handed whole to ``sender.deliver`` and its answer
   used as is; the breaker is asked for the others, once per provider for all its rows
   (``CircuitBreaker.allow_many``: one Redis round trip), and a row it refuses is parked as
   the single path parks it (``CIRCUIT_OPEN``, no attempt spent).
3. One fenced UPDATE (``batch_transitions.take_many``) takes the rest to ``sending`` and commits
   *before* any request leaves (G2); a row whose fence moved meanwhile is skipped.
4. The sends run on this process's small thread pool (``send_concurrency`` in flight), each
   recorded in its provider's breaker. A send starts only while it can still finish within
   its row's lease (``start_by``): one that waited too long in the pool (a slow provider
   holds every thread) is not made; its row goes back to ``pending`` with its attempt given
   back (``SEND_LATE``), instead of racing the sweeper, which hands an expired ``sending``
   row to its policy and so to another worker.
5. One transaction writes every delivered message's attempt row (one multi-row INSERT) and
   its ``sent`` (one UPDATE, fenced per row); every other outcome goes through
   ``settle.after_send`` as on the single path.

A batch that fails midway leaves each message where the single path would: ``dispatched``
(not yet taken: a redelivered task takes it again) or ``sending`` (taken: its worker stops
renewing the lease, and the sweeper hands it to its ``on_unknown`` policy ``hold_lease``
seconds later). Nothing is lost; a second effect is only the provider's to dedupe, as on the
single path.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Row, bindparam

from delivery.guards.breaker import Permit, Recorded
from delivery.observability.events import Transition, emit
from delivery.pipeline import outcomes, settle
from delivery.pipeline.batch_transitions import Take, finish_sent_many, log_attempts, take_many
from delivery.pipeline.clock import read_with_clock, sql_now
from delivery.pipeline.models import messages_table
from delivery.pipeline.sender import ROW, breaker_verdict, circuit_open, deliver, in_flight
from delivery.pipeline.status import Status
from delivery.pipeline.transitions import Action, Result, Sending, attempt_row, move
from delivery.providers import calls
from delivery.providers.base import Envelope
from delivery.runtime.service import Service

__all__ = ["SEND_LATE", "deliver_many", "send_pool"]

_T = TypeVar("_T")
_SKIP_TAKEN = Result(Action.SKIP, reason="taken by another worker")
_CHANGED = Result(Action.SKIP, reason="row changed while sending")
_REPEATED = Result(Action.SKIP, reason="repeated in its batch")
SEND_LATE = "SEND_LATE"


@dataclass(frozen=True, slots=True)
class _Ready:
    """A row the breaker let through, waiting to be taken."""

    row: Row[Any]
    permit: Permit


@dataclass(frozen=True, slots=True)
class _Sent:
    """One send of the batch: the message, its outcome, how long the call took (ms) and what
    the breaker answered when it was recorded; ``outcome`` None: the send was not made (too
    late to finish within the lease)."""

    msg: Sending
    outcome: outcomes.Outcome | None
    latency: float
    breaker: Recorded


_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def send_pool(size: int) -> ThreadPoolExecutor:
    """This process's pool of send threads (``size`` of them; made again after a fork)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max(size, 1), thread_name_prefix="delivery-send")
            _pool_pid = os.getpid()
        return _pool


def _run_all(service: Service, calls_: Sequence[Callable[[], _T]]) -> list[_T]:
    """Run ``calls_`` on the send pool (inline when there is only one) and return their
    results in order; an exception in one call is raised once all have finished."""
    if len(calls_) <= 1 or service.settings.send_concurrency <= 1:
        return [call() for call in calls_]
    pool = send_pool(service.settings.send_concurrency)
    futures: list[Future[_T]] = [pool.submit(call) for call in calls_]
    return [future.result() for future in futures]


def _ready(service: Service, row: Row[Any], now: dt.datetime) -> bool:
    """True when ``row`` can be taken as it is, with no check of the single path left."""
    if row.status != Status.DISPATCHED or row.needs_lookup:
        return False
    if row.provider not in service.settings.providers:
        return False
    if row.next_attempt_at > now:
        return False
    if row.expires_at is not None and now >= row.expires_at:
        return False
    return service.limiter(row.provider) is None


#: The batch's rows, one statement object for every batch (``read_with_clock`` keeps it).
_ROWS_BY_IDS = ROW.where(messages_table.c.id.in_(bindparam("ids", expanding=True)))


def deliver_many(
    service: Service,
    pairs: Sequence[tuple[int, str]],
    *,
    on_read: Callable[[Mapping[int, int]], object] | None = None,
) -> list[Result]:
    """One attempt at each message of ``pairs`` (id, key); the ``Result`` of each, in order
    (a pair repeated in the batch is skipped the second time). ``on_read`` is called with
    each found message's attempt count once the rows are read, before anything is sent."""
    with service.autocommit.connect() as conn:
        ids = sorted({message_id for message_id, _ in pairs})
        rows, now = read_with_clock(conn, _ROWS_BY_IDS, {"ids": ids})
    by_id = {row.id: row for row in rows}
    if on_read is not None:
        on_read({row.id: row.attempts for row in rows})
    results: dict[int, Result] = {}
    single: list[tuple[int, str]] = []
    ready: list[_Ready] = []
    seen: set[int] = set()
    candidates: list[Row[Any]] = []
    for message_id, key in pairs:
        if message_id in seen:
            continue
        seen.add(message_id)
        row = by_id.get(message_id)
        if row is None or row.key != key or not _ready(service, row, now):
            single.append((message_id, key))
        else:
            candidates.append(row)
    for row, permit in _permits(service, candidates):
        if not permit.allowed:
            results[row.id] = circuit_open(service, row, permit, now)
        else:
            ready.append(_Ready(row, permit))

    sends = _take(service, ready, now, results)
    jobs: list[Callable[[], Any]] = [_send_call(service, s) for s in sends]
    jobs += [_single_call(service, message_id, key) for message_id, key in single]
    answers = _run_all(service, jobs)
    sent: list[_Sent] = answers[: len(sends)]
    for (message_id, _), result in zip(single, answers[len(sends) :], strict=True):
        results[message_id] = result
    results.update(_settle(service, sent))
    answered: set[int] = set()
    out: list[Result] = []
    for message_id, _ in pairs:
        out.append(_REPEATED if message_id in answered else results[message_id])
        answered.add(message_id)
    return out


def _take(
    service: Service, ready: Sequence[_Ready], now: dt.datetime, results: dict[int, Result]
) -> list[tuple[Sending, Envelope, _Ready, float]]:
    """Take the ready rows to ``sending`` in one committed UPDATE; what to send."""
    if not ready:
        return []
    settings = service.settings
    lease = now + dt.timedelta(seconds=settings.hold_lease)
    # The lease keeper renews a taken row up to send_lease after its take, every hold_lease/3
    # s, so its lease surely lasts until send_lease - hold_lease/3 after it (timed from before
    # the statement: never later than the database's).
    lasts = time.monotonic() + settings.send_lease - settings.hold_lease / 3
    with service.engine.begin() as conn:
        taken = take_many(
            conn, [Take(r.row.id, r.row.attempts) for r in ready], lease_until=lease, now=now
        )
    sends: list[tuple[Sending, Envelope, _Ready, float]] = []
    for r in ready:
        row = r.row
        if row.id not in taken:
            service.breaker(row.provider).release(r.permit)
            results[row.id] = _SKIP_TAKEN
            continue
        attempt = row.attempts + 1
        emit(Transition(row.id, row.key, row.provider, Status.DISPATCHED, Status.SENDING, attempt))
        envelope = Envelope(row.key, row.channel, row.recipient, dict(row.payload))
        start_by = lasts - settings.providers[row.provider].timeouts.total
        sends.append((in_flight(service, row, attempt), envelope, r, start_by))
    return sends


def _send_call(
    service: Service, send: tuple[Sending, Envelope, _Ready, float]
) -> Callable[[], _Sent]:
    msg, envelope, ready, start_by = send

    def call() -> _Sent:
        if time.monotonic() > start_by:  # could outlast its lease: not made (see step 4)
            service.breaker(msg.provider).release(ready.permit)
            return _Sent(msg, None, 0.0, Recorded())
        started = time.perf_counter()
        outcome = calls.send(service.provider(msg.provider), envelope)
        latency = (time.perf_counter() - started) * 1000.0
        recorded = service.breaker(msg.provider).record(ready.permit, breaker_verdict(outcome))
        return _Sent(msg, outcome, latency, recorded)

    return call


def _permits(service: Service, rows: Sequence[Row[Any]]) -> list[tuple[Row[Any], Permit]]:
    """The breaker's permit for each row: one ``allow_many`` per provider, in batch order
    (in half-open, the provider's first row carries the probe)."""
    by_provider: dict[str, list[Row[Any]]] = {}
    for row in rows:
        by_provider.setdefault(row.provider, []).append(row)
    permits: list[tuple[Row[Any], Permit]] = []
    for provider, mine in by_provider.items():
        granted = service.breaker(provider).allow_many(len(mine))
        permits += zip(mine, granted, strict=True)
    return permits


def _single_call(service: Service, message_id: int, key: str) -> Callable[[], Result]:
    return lambda: deliver(service, message_id, key)


def _settle(service: Service, sent: Sequence[_Sent]) -> dict[int, Result]:
    """Delivered messages: attempt rows and ``sent`` in one transaction; the others one by
    one through ``settle.after_send``."""
    results: dict[int, Result] = {}
    accepted = [(s, s.outcome) for s in sent if isinstance(s.outcome, outcomes.Delivered)]
    if accepted:
        with service.engine.begin() as conn:
            log_attempts(conn, [attempt_row(s.msg, "send", o, s.latency) for s, o in accepted])
            moved = finish_sent_many(
                conn, [(s.msg, o.provider_ref) for s, o in accepted], sql_now(conn)
            )
        for s, _ in accepted:
            msg = s.msg
            if msg.id not in moved:
                results[msg.id] = _CHANGED
                continue
            settle.emit(msg, Status.SENT, "delivered", enqueued_at=msg.enqueued_at)
            results[msg.id] = Result(Action.DONE, Status.SENT)
    for s in sent:
        if s.outcome is None:
            results[s.msg.id] = _give_back(service, s.msg)
        elif not isinstance(s.outcome, outcomes.Delivered):
            # after_send measures from ``started``: the call's own time, not the batch's.
            started = time.perf_counter() - s.latency / 1000.0
            results[s.msg.id] = settle.after_send(service, s.msg, s.outcome, started, s.breaker)
    return results


def _give_back(service: Service, msg: Sending) -> Result:
    """A taken row whose send was not made: back to ``pending``, due now, its attempt given
    back as a 409's is (``max_attempts`` + 1: the attempt count, every update's fence, never
    goes back); fenced on this attempt, so a row the sweeper already moved is left alone."""
    reason = "the send could not start in time to finish within its lease; not made"
    with service.engine.begin() as conn:
        done = move(
            conn,
            msg.id,
            msg.attempt,
            Status.SENDING,
            Status.PENDING,
            max_attempts=msg.max_attempts + 1,
            lease_expires_at=None,
            next_attempt_at=sql_now(conn),
            last_error_code=SEND_LATE,
            last_error=reason,
        )
    if not done:
        return _CHANGED
    # No outcome: no attempt was made, so the metrics count none (``observe_transition``).
    emit(
        Transition(
            msg.id,
            msg.key,
            msg.provider,
            Status.SENDING,
            Status.PENDING,
            msg.attempt,
            None,
            SEND_LATE,
            0.0,
        )
    )
    return Result(Action.PARKED, Status.PENDING, 0.0, SEND_LATE, reason)
