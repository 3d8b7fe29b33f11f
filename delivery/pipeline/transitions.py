"""The worker's vocabulary and primitives: what the task does next, the message in flight,
and the conditional UPDATEs every transition of an attempt goes through.

- ``Action`` and ``Result``: the closed answer of one attempt to its task (``sender.deliver``).
- ``Sending``: the frozen description of the message in flight (this attempt's number, its
  policy and backoff); ``Failure``: why an attempt did not end it, and what to log.
- ``move``: the one conditional UPDATE of a row (status *and* attempt count as seen), and
  ``move_lost`` the same for a ``sending`` row whose lease passed (the sweeper's); ``finish``
  moves this attempt's ``sending`` row; ``park`` puts it back to wait; ``log_attempt`` writes the
  attempt's row, ``log_lost`` the row of an attempt whose worker was lost.
- ``move_all``: the conditional UPDATE of a batch (the sweeper's expired leases and
  time-to-lives): every row in the expected status that matches, the status as its fence.
  A new path (a batch, a lease renewal) gets a primitive of the same kind here, not an
  inline UPDATE.
"""

from __future__ import annotations

import datetime as dt
import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, insert, update

from delivery.config.settings import Backoff, Settings
from delivery.pipeline.models import attempts_table, messages_table, utcnow
from delivery.pipeline.outcomes import LookupOutcome, Outcome, Retryable
from delivery.pipeline.policies import UnknownPolicy
from delivery.pipeline.status import Status

__all__ = [
    "IN_PROGRESS",
    "LEASE_EXPIRED",
    "MOVED",
    "Action",
    "Failure",
    "Result",
    "Sending",
    "finish",
    "in_progress",
    "log_attempt",
    "log_lost",
    "move",
    "move_all",
    "move_lost",
    "park",
]

IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS"
"""The code of a provider saying our own earlier attempt with this key is still running."""

LEASE_EXPIRED = "LEASE_EXPIRED"
"""The code of an attempt whose worker was lost: its lease passed during the send."""


class Action(enum.StrEnum):
    """What the task does after one attempt; the closed set ``Result.action`` takes."""

    DONE = "done"
    """A final state was reached (``Result.status`` says which)."""
    RETRY = "retry"
    """Re-run the task after ``Result.delay`` seconds; the row waits as ``dispatched``."""
    PARKED = "parked"
    """The row went back to the outbox as ``pending``; the relay publishes it when due."""
    SKIP = "skip"
    """Nothing to do: no such message, not ours, not due, or taken by another worker."""


@dataclass(frozen=True, slots=True)
class Result:
    """What the task should do next (``action``), and why."""

    action: Action
    status: str | None = None
    delay: float | None = None
    code: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Sending:
    """The message in flight: read once when the worker takes it, then passed along."""

    id: int
    key: str
    provider: str
    attempt: int
    max_attempts: int
    policy: UnknownPolicy
    backoff: Backoff
    enqueued_at: dt.datetime
    in_progress_wait: float | None = None
    """How long the provider may take on a key (its own budget), waited out on a 409."""


@dataclass(frozen=True, slots=True)
class Failure:
    """An attempt that did not deliver: its ``code`` and ``reason`` (stored on the row), the
    ``outcome`` kind for the transition log, the status the message ends in when it is not
    retried (``final``: permanent, given up, or attempts spent), the provider's
    ``retry_after`` wish, and whether the next attempt must look the key up first
    (``needs_lookup``; ``None`` leaves the flag as it is)."""

    code: str
    reason: str
    outcome: str
    final: Status
    retry_after: float | None = None
    needs_lookup: bool | None = None


def in_progress(outcome: Outcome) -> bool:
    """True when the provider answers that our own earlier attempt is still being processed:
    not a failure, and no attempt of ours to spend."""
    return isinstance(outcome, Retryable) and outcome.code == IN_PROGRESS


def log_attempt(
    conn: Connection, msg: Sending, kind: str, outcome: Outcome | LookupOutcome, started: float
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


def move(
    conn: Connection,
    message_id: int,
    seen_attempts: int,
    expected: Status,
    to: Status,
    **values: object,
) -> bool:
    """The one conditional UPDATE of a worker: ``expected`` -> ``to``, only while the row is
    where this worker saw it (status and attempt count). False: someone else moved it."""
    return _move(conn, (message_id, seen_attempts, expected), to, None, values)


def move_lost(
    conn: Connection,
    message_id: int,
    seen_attempts: int,
    to: Status,
    *,
    now: dt.datetime,
    values: Mapping[str, object],
) -> bool:
    """The sweeper's ``move`` of a ``sending`` row whose worker was lost: only while it is
    still this attempt's and its lease passed before ``now`` (a renewal since then wins)."""
    when = messages_table.c.lease_expires_at < now
    return _move(conn, (message_id, seen_attempts, Status.SENDING), to, when, values)


def _move(
    conn: Connection,
    fence: tuple[int, int, Status],
    to: Status,
    when: ColumnElement[bool] | None,
    values: Mapping[str, object],
) -> bool:
    """The conditional UPDATE behind ``move`` and ``move_lost``: the row ``fence`` names (id,
    attempt count, status as seen), if ``when`` holds too; ``updated_at`` is now unless
    ``values`` set it."""
    message_id, seen_attempts, expected = fence
    stmt = update(messages_table).where(
        messages_table.c.id == message_id,
        messages_table.c.status == expected.value,
        messages_table.c.attempts == seen_attempts,
    )
    if when is not None:
        stmt = stmt.where(when)
    done = conn.execute(
        stmt.values(**{"status": to.value, "updated_at": utcnow(), **values})
    ).rowcount
    return bool(done)


#: What ``move_all`` returns of each row it moved (for the transition log).
MOVED = (
    messages_table.c.id,
    messages_table.c.key,
    messages_table.c.provider,
    messages_table.c.attempts,
)


def move_all(
    conn: Connection,
    expected: Status,
    to: Status,
    when: ColumnElement[bool],
    **values: object,
) -> list[Row[Any]]:
    """The conditional UPDATE of a batch: every row in ``expected`` for which ``when`` holds
    moves to ``to`` (the status is the fence: a row another process moved meanwhile is left
    alone). Returns ``MOVED`` of each row moved."""
    return list(
        conn.execute(
            update(messages_table)
            .where(messages_table.c.status == expected.value, when)
            .values(**{"status": to.value, **values})
            .returning(*MOVED)
        ).all()
    )


def log_lost(conn: Connection, message_id: int, number: int, now: dt.datetime, reason: str) -> None:
    """The attempt row of a send whose worker was lost (its lease passed): outcome unknown."""
    conn.execute(
        insert(attempts_table).values(
            message_id=message_id,
            number=number,
            kind="send",
            started_at=now,
            outcome="unknown",
            error_code=LEASE_EXPIRED,
            error=reason,
        )
    )


def finish(conn: Connection, msg: Sending, status: Status, **values: object) -> bool:
    """Move the row from ``sending`` (this attempt) to ``status``; False if someone else did."""
    return move(conn, msg.id, msg.attempt, Status.SENDING, status, **values)


def park(
    conn: Connection,
    msg: Sending,
    delay: float,
    settings: Settings,
    failure: Failure,
    *,
    now: dt.datetime,
    **values: object,
) -> Status | None:
    """Park a ``sending`` row until ``now + delay``; the status it got, or None if someone
    else moved it.

    ``now`` is the database's clock (``delivery.pipeline.clock``); ``values`` are further columns to
    set. A short wait stays ``dispatched`` (the task re-runs itself with a countdown, visible in
    Flower as a retry; the lease covers the wait, so a lost retry is recovered by the sweeper
    ``hold_lease`` s after it was due). A long one goes back to the outbox as ``pending``: the
    broker never holds a task longer than ``max_countdown``.
    """
    due = now + dt.timedelta(seconds=delay)
    short = delay <= settings.max_countdown
    status = Status.DISPATCHED if short else Status.PENDING
    # The worker holds a short retry: once due it renews the lease (delivery.pipeline.leases);
    # if it dies meanwhile, the row comes back hold_lease s after its due time.
    lease_until = due + dt.timedelta(seconds=settings.hold_lease) if short else None
    extra = {} if failure.needs_lookup is None else {"needs_lookup": failure.needs_lookup}
    done = finish(
        conn,
        msg,
        status,
        next_attempt_at=due,
        lease_expires_at=lease_until,
        last_error_code=failure.code[:64],
        last_error=failure.reason,
        **extra,
        **values,
    )
    return status if done else None
