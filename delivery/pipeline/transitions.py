"""The worker's vocabulary and primitives: what the task does next, the message in flight,
and the conditional UPDATEs every transition of an attempt goes through.

- ``Action`` and ``Result``: the closed answer of one attempt to its task (``sender.deliver``).
- ``Sending``: the frozen description of the message in flight (this attempt's number, its
  policy and backoff); ``Failure``: why an attempt did not end it, and what to log.
- ``move``: the one conditional UPDATE of a row (status *and* attempt count as seen;
  ``move_where`` adds a further condition, e.g. the sweeper's "its lease has passed":
  ``delivery.pipeline.lifeline``); ``finish`` moves this attempt's ``sending`` row; ``park``
  puts it back to wait; ``log_attempt`` writes the attempt's row. A new path (a batch, a
  lease renewal) gets a primitive of the same kind, not an inline UPDATE.
- ``finish_sent``: ``sending`` -> ``sent`` for one message or many with their attempt rows, one
  statement. ``extend_lease`` moves only a lease (a ``dispatched`` row waiting for its rate
  limit).
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    ClauseElement,
    ColumnElement,
    Connection,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    any_,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from delivery.config.settings import Backoff, Settings
from delivery.pipeline.models import UTCDateTime, attempts_table, messages_table, utcnow
from delivery.pipeline.outcomes import Delivered, LookupOutcome, Outcome, Retryable
from delivery.pipeline.policies import UnknownPolicy
from delivery.pipeline.status import Status

__all__ = [
    "IN_PROGRESS",
    "Action",
    "Failure",
    "Result",
    "Sending",
    "attempt_row",
    "extend_lease",
    "finish",
    "finish_sent",
    "in_progress",
    "log_attempt",
    "move",
    "move_where",
    "park",
]

IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS"
"""The code of a provider saying our own earlier attempt with this key is still running."""


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


def attempt_row(
    msg: Sending, kind: str, outcome: Outcome | LookupOutcome, latency: float
) -> dict[str, Any]:
    """The attempt row of one call that took ``latency`` ms and ended just now."""
    return dict(
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


def log_attempt(
    conn: Connection, msg: Sending, kind: str, outcome: Outcome | LookupOutcome, started: float
) -> None:
    latency = (time.perf_counter() - started) * 1000.0
    conn.execute(_INSERT_ATTEMPT, attempt_row(msg, kind, outcome, latency))


#: One statement object for every attempt row (built per call, it cost SQLAlchemy's cache key
#: each time), inline: the row's new id is not asked back (``RETURNING``).
_INSERT_ATTEMPT = insert(attempts_table).inline()


def extend_lease(conn: Connection, message_id: int, seen_attempts: int, until: dt.datetime) -> bool:
    """Extend the lease of a ``dispatched`` row (waiting, not taken) to ``until``, fenced like
    ``move``; False if the row moved meanwhile."""
    fence = (message_id, seen_attempts, Status.DISPATCHED)
    return move(conn, *fence, Status.DISPATCHED, lease_expires_at=until)


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
    return move_where(conn, (message_id, seen_attempts, expected), to, None, values)


def move_where(
    conn: Connection,
    fence: tuple[int, int, Status],
    to: Status,
    when: ColumnElement[bool] | None,
    values: Mapping[str, object],
) -> bool:
    """The conditional UPDATE behind ``move`` (and the sweeper's ``lifeline.move_lost``): the
    row ``fence`` names (id, attempt count, status as seen), if ``when`` holds too;
    ``updated_at`` is now unless ``values`` set it."""
    message_id, seen_attempts, expected = fence
    changes = _changes(to, values)
    if when is None:
        params = _move_params(fence, changes)
        return bool(conn.execute(_move_statement(changes), params).rowcount)
    stmt = update(messages_table).where(
        messages_table.c.id == message_id,
        messages_table.c.status == expected.value,
        messages_table.c.attempts == seen_attempts,
        when,
    )
    return bool(conn.execute(stmt.values(**changes)).rowcount)


def _changes(to: Status, values: Mapping[str, object]) -> dict[str, object]:
    """The columns a move to ``to`` sets: ``values``, the status, and ``updated_at`` (now)
    unless ``values`` set it."""
    return {"status": to.value, "updated_at": utcnow(), **values}


def _move_params(fence: tuple[int, int, Status], changes: Mapping[str, object]) -> dict[str, Any]:
    message_id, seen_attempts, expected = fence
    params = {f"set_{k}": v for k, v in changes.items() if not isinstance(v, ClauseElement)}
    params |= {"fence_id": message_id, "fence_status": expected.value}
    params["fence_attempts"] = seen_attempts
    return params


_MOVES: dict[tuple[tuple[str, int], ...], Any] = {}


def _move_statement(changes: Mapping[str, object]) -> Any:
    """The fenced UPDATE setting ``changes``' columns, each from a parameter or from the SQL
    expression given (``sql_now``'s clock is one object). Kept per shape (``move``'s callers
    use a handful; an expression by its identity, which the kept statement keeps alive):
    built per call, its cache key cost about as much as the statement's round trip."""
    shape = tuple(
        (name, id(value) if isinstance(value, ClauseElement) else 0)
        for name, value in sorted(changes.items(), key=lambda item: item[0])
    )
    statement = _MOVES.get(shape)
    if statement is None:
        m = messages_table.c
        statement = (
            update(messages_table)
            .where(
                m.id == bindparam("fence_id"),
                m.status == bindparam("fence_status"),
                m.attempts == bindparam("fence_attempts"),
            )
            .values(
                {
                    name: value if isinstance(value, ClauseElement) else bindparam(f"set_{name}")
                    for name, value in changes.items()
                }
            )
        )
        if len(_MOVES) < 128:
            _MOVES[shape] = statement
    return statement


def finish(conn: Connection, msg: Sending, status: Status, **values: object) -> bool:
    """Move the row from ``sending`` (this attempt) to ``status``; False if someone else did."""
    return move(conn, msg.id, msg.attempt, Status.SENDING, status, **values)


def finish_sent(conn: Connection, sent: Sequence[tuple[Sending, Delivered, float]]) -> set[int]:
    """``sending`` -> ``sent`` for each ``(message in flight, its delivery, the call's latency
    in ms)``, fenced per row on this attempt, together with each call's attempt row; the ids
    it moved. ``sent_at`` is the database's clock.

    On PostgreSQL one statement, whatever the number of rows, and durable in autocommit: an
    ``UPDATE .. FROM unnest(one array per column)`` whose data-modifying CTE inserts the
    attempt rows (written whether or not a fence holds: the calls were made either way), its
    rows locked in id order (two overlapping statements wait, never deadlock). Elsewhere
    (SQLite) one INSERT and one ``move`` per row: run it in a transaction."""
    if not sent:
        return set()
    attempts = [attempt_row(msg, "send", outcome, latency) for msg, outcome, latency in sent]
    if conn.dialect.name != "postgresql":
        conn.execute(insert(attempts_table), attempts)
        done = dict(_SENT, sent_at=utcnow())
        return {
            msg.id
            for msg, outcome, _ in sent
            if finish(conn, msg, Status.SENT, provider_ref=outcome.provider_ref, **done)
        }
    params: dict[str, Any] = {
        "ids": [msg.id for msg, _, _ in sent],
        "seen": [msg.attempt for msg, _, _ in sent],
        "refs": [outcome.provider_ref for _, outcome, _ in sent],
        "b_now": utcnow(),
    }
    params |= {f"a_{name}": [row[name] for row in attempts] for name in _ATTEMPT_COLUMNS}
    return set(conn.scalars(_sent_statement(), params))


#: What ``sent`` clears, on every path to it.
_SENT: dict[str, Any] = dict(
    lease_expires_at=None, needs_lookup=False, last_error_code=None, last_error=None
)

_ATTEMPT_COLUMNS: dict[str, Any] = {
    "message_id": BigInteger(),
    "number": Integer(),
    "kind": String(),
    "outcome": String(),
    "started_at": DateTime(timezone=True),
    "http_status": Integer(),
    "latency_ms": Float(),
    "error_code": String(),
    "error": Text(),
}


def _unnest(name: str, *columns: tuple[str, Any]) -> Any:
    """A table of bound arrays, one column each (``unnest(:a, :b) AS name(a, b)``): one
    statement whatever the number of rows."""
    arrays = [bindparam(column, type_=ARRAY(kind)) for column, kind in columns]
    return func.unnest(*arrays).table_valued(*(n for n, _ in columns)).render_derived(name=name)


@functools.cache
def _sent_statement() -> Any:
    m = messages_table.c
    rows = _unnest("v", ("ids", BigInteger()), ("seen", Integer()), ("refs", String()))
    logged = _unnest("a", *((f"a_{n}", kind) for n, kind in _ATTEMPT_COLUMNS.items()))
    log = insert(attempts_table).from_select(list(_ATTEMPT_COLUMNS), select(*logged.c))
    wanted = m.id == any_(bindparam("ids", type_=ARRAY(BigInteger())))
    # Locked in id order, the locking subquery run once (``= ANY(ARRAY(..))``; under ``IN``
    # it ran once per row of the table's status).
    locked = select(m.id).where(wanted).order_by(m.id).with_for_update()
    return (
        update(messages_table)
        .where(m.id == rows.c.ids, m.status == Status.SENDING.value, m.attempts == rows.c.seen)
        .where(m.id == any_(func.array(locked.scalar_subquery())))
        .values(
            status=Status.SENT.value,
            updated_at=bindparam("b_now", type_=UTCDateTime()),
            provider_ref=rows.c.refs,
            sent_at=func.clock_timestamp(type_=UTCDateTime()),
            **_SENT,
        )
        .returning(m.id)
        .add_cte(log.cte("attempt"))
    )


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
