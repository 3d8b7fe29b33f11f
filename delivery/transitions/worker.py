"""The worker's transitions of a message (take, leave, extend_lease, finish_sent, stop, park,
give_back, renew), each a named function over one row or many, fenced on the status and
attempt count its worker saw (``fence.move``) and emitting its ``Transition`` once its UPDATE
moved the row. Every code and reason stored comes from an outcome or a constant of ours,
already bounded (``delivery.core.bounds``).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Row,
    String,
    and_,
    any_,
    bindparam,
    func,
    insert,
    select,
    update,
)

from delivery.config.settings import Settings
from delivery.core.clock import sql_now
from delivery.core.models import UTCDateTime, attempts_table, messages_table, utcnow
from delivery.core.outcomes import Delivered, Found
from delivery.core.status import Status
from delivery.observability import tracing
from delivery.observability.events import Transition, emit
from delivery.transitions.attempts import ATTEMPT_COLUMNS, attempt_row
from delivery.transitions.fence import among, among_params, move, unnest
from delivery.transitions.vocabulary import Failure, Sending

__all__ = [
    "Accepted",
    "Leave",
    "extend_lease",
    "finish_sent",
    "give_back",
    "leave",
    "park",
    "renew",
    "stop",
    "take",
]

#: One object, so that the statement built around it can be kept (as ``clock.sql_now``'s).
_CLOCK_NOW = func.clock_timestamp(type_=UTCDateTime())


@dataclass(frozen=True, slots=True)
class _Event:
    """What a transition's event says besides the move: the outcome, code and delay."""

    outcome: str | None = None
    code: str | None = None
    delay: float | None = None


def take(conn: Connection, rows: Sequence[Row[Any]], lease_until: dt.datetime) -> set[int]:
    """``dispatched`` -> ``sending`` for each of ``rows`` still where its reader saw it,
    spending one attempt each (number ``row.attempts + 1``), leased until ``lease_until``; the
    ids it took. On PostgreSQL one statement for one row or many, its rows locked in id order;
    elsewhere one ``move`` per row."""
    if conn.dialect.name != "postgresql":
        taken = {
            row.id
            for row in rows
            if move(
                conn,
                row.id,
                row.attempts,
                Status.DISPATCHED,
                Status.SENDING,
                attempts=row.attempts + 1,
                lease_expires_at=lease_until,
            )
        }
    elif rows:
        params = {
            **among_params("ids", [row.id for row in rows]),
            "seen": [row.attempts for row in rows],
            "b_lease": lease_until,
            "b_now": utcnow(),
        }
        taken = set(conn.scalars(_take_statement(), params))
    else:
        taken = set()
    tracing.begin_attempts(row for row in rows if row.id in taken)  # each take's event opens
    for row in rows:
        if row.id in taken:
            moved = (Status.DISPATCHED, Status.SENDING, row.attempts + 1)
            emit(Transition(row.id, row.key, row.provider, *moved))
    return taken


@functools.cache
def _take_statement() -> Any:
    m = messages_table.c
    seen = unnest("v", ("ids", BigInteger()), ("seen", Integer()))
    return (
        update(messages_table)
        .where(m.id == seen.c.ids, m.status == Status.DISPATCHED.value, m.attempts == seen.c.seen)
        .where(_locked_in_order())
        .values(
            status=Status.SENDING.value,
            attempts=seen.c.seen + 1,
            lease_expires_at=bindparam("b_lease", type_=UTCDateTime()),
            updated_at=bindparam("b_now", type_=UTCDateTime()),
        )
        .returning(m.id)
    )


def _locked_in_order() -> Any:
    """``id`` is one of the bound array ``ids`` (``among``: the UPDATE itself names them, so
    that it plans only their days), locked in id order (overlapping statements wait, never
    deadlock), the locking subquery run once (``= ANY(ARRAY(..))``; under ``IN`` it ran once
    per row of the status)."""
    m = messages_table.c
    wanted = among(m.id, "ids")
    locked = select(m.id).where(wanted).order_by(m.id).with_for_update()
    return and_(wanted, m.id == any_(func.array(locked.scalar_subquery())))


@dataclass(frozen=True, slots=True)
class Leave:
    """A ``dispatched`` row leaving without an attempt: where to, and what to log and store."""

    to: Status
    outcome: str
    code: str
    reason: str
    delay: float | None = None


def leave(conn: Connection, row: Row[Any], why: Leave, **values: object) -> bool:
    """Move a row its worker never took out of ``dispatched`` (no attempt spent), storing
    ``why``'s code and reason; False if someone else moved it first."""
    if not move(
        conn,
        row.id,
        row.attempts,
        Status.DISPATCHED,
        why.to,
        lease_expires_at=None,
        last_error_code=why.code,
        last_error=why.reason,
        **values,
    ):
        return False
    emit(
        Transition(
            row.id,
            row.key,
            row.provider,
            Status.DISPATCHED,
            why.to,
            row.attempts,
            why.outcome,
            why.code,
            why.delay,
            message_type=getattr(row, "message_type", None),
            traceparent=getattr(row, "traceparent", None),
        )
    )
    return True


def extend_lease(conn: Connection, message_id: int, seen_attempts: int, until: dt.datetime) -> bool:
    """Extend the lease of a ``dispatched`` row (waiting, not taken) to ``until``, fenced like
    every move; False if the row moved meanwhile. Not a transition: no event."""
    fence = (message_id, seen_attempts, Status.DISPATCHED)
    return move(conn, *fence, Status.DISPATCHED, lease_expires_at=until)


def renew(conn: Connection, msg: Sending, until: dt.datetime) -> bool:
    """A lookup found nothing: the ``sending`` row's lease to ``until`` and its lookup flag
    cleared, fenced on this attempt; False if it is no longer this attempt's (the lookup
    outlived the lease): then nothing is sent. The provider has nothing for the key, so the
    message is no longer ``pinned`` to it. Not a transition: no event."""
    fence = (msg.id, msg.attempt, Status.SENDING)
    return move(
        conn, *fence, Status.SENDING, lease_expires_at=until, needs_lookup=False, pinned=False
    )


def _finish(conn: Connection, msg: Sending, to: Status, event: _Event, **values: object) -> bool:
    """This attempt's ``sending`` row to ``to``, emitting ``event``; False if someone else
    moved it."""
    if not move(conn, msg.id, msg.attempt, Status.SENDING, to, **values):
        return False
    _announce(msg, to, event)
    return True


def stop(conn: Connection, msg: Sending, failure: Failure) -> bool:
    """End this attempt's ``sending`` row in ``failure.final`` (``dead`` or ``unknown``)."""
    event = _Event(failure.outcome, failure.code)
    values = dict(lease_expires_at=None, last_error_code=failure.code, last_error=failure.reason)
    return _finish(conn, msg, failure.final, event, **values, **_pins(failure))


def _pins(failure: Failure) -> dict[str, bool]:
    """``pinned`` set when the attempt may have taken effect; left as it is when it created
    nothing (an earlier attempt may have pinned the message)."""
    return {"pinned": True} if failure.pins else {}


def give_back(conn: Connection, msg: Sending, why: Leave, due: dt.datetime) -> bool:
    """``sending`` -> ``why.to`` (``pending``, due at ``due``) for a row taken whose call was
    never made (its breaker opened before its turn came, or the call could no longer end
    within its lease), fenced on this attempt; False if someone else moved it. No call was
    made, so the event has no outcome (the metrics count no attempt) and the attempt is given
    back: ``max_attempts`` + 1, as for a 409 in progress, since the attempt count (the fence)
    never goes back."""
    values = dict(
        max_attempts=msg.max_attempts + 1,
        lease_expires_at=None,
        next_attempt_at=due,
        last_error_code=why.code,
        last_error=why.reason,
    )
    return _finish(conn, msg, why.to, _Event(None, why.code, why.delay), **values)


def _announce(msg: Sending, to: Status, event: _Event) -> None:
    emit(
        Transition(
            msg.id,
            msg.key,
            msg.provider,
            Status.SENDING,
            to,
            msg.attempt,
            event.outcome,
            event.code,
            event.delay,
            msg.enqueued_at if to is Status.SENT else None,
            msg.message_type,
        )
    )


#: What a call made sent: ``(message in flight, "send" or "lookup", its delivery or the
#: lookup's finding, the call's latency in ms)``.
Accepted = tuple[Sending, str, Delivered | Found, float]


def finish_sent(conn: Connection, sent: Sequence[Accepted]) -> set[int]:
    """``sending`` -> ``sent`` for each accepted call (a delivery, or a lookup that found the
    message), fenced per row on this attempt, together with each call's attempt row; the ids
    it moved. ``sent_at`` is the database's clock. The one writer of ``sent``.

    On PostgreSQL one statement, whatever the number of rows, and durable in autocommit: an
    ``UPDATE .. FROM unnest(one array per column)`` whose data-modifying CTE inserts the
    attempt rows (written whether or not a fence holds: the calls were made either way), its
    rows locked in id order (two overlapping statements wait, never deadlock). Elsewhere
    (SQLite) one INSERT and one ``move`` per row: run it in a transaction."""
    if not sent:
        return set()
    attempts = [attempt_row(msg, kind, outcome, latency) for msg, kind, outcome, latency in sent]
    if conn.dialect.name != "postgresql":
        conn.execute(insert(attempts_table), attempts)
        done = _sent_values(conn)
        return {
            msg.id
            for msg, _, outcome, _ in sent
            if _finish(
                conn,
                msg,
                Status.SENT,
                _Event(outcome.kind),
                provider_ref=outcome.provider_ref,
                **done,
            )
        }
    params: dict[str, Any] = {
        **among_params("ids", [msg.id for msg, _, _, _ in sent]),
        "seen": [msg.attempt for msg, _, _, _ in sent],
        "refs": [outcome.provider_ref for _, _, outcome, _ in sent],
        "b_now": utcnow(),
    }
    params |= {f"a_{name}": [row[name] for row in attempts] for name in ATTEMPT_COLUMNS}
    moved = set(conn.scalars(_sent_statement(), params))
    for msg, _, outcome, _ in sent:
        if msg.id in moved:
            _announce(msg, Status.SENT, _Event(outcome.kind))
    return moved


#: What ``sent`` clears, on every path to it.
_SENT: dict[str, Any] = dict(
    lease_expires_at=None, needs_lookup=False, last_error_code=None, last_error=None
)


def _sent_values(conn: Connection) -> dict[str, Any]:
    return dict(_SENT, sent_at=sql_now(conn))  # the database's clock, inside the UPDATE


@functools.cache
def _sent_statement() -> Any:
    m = messages_table.c
    rows = unnest("v", ("ids", BigInteger()), ("seen", Integer()), ("refs", String()))
    logged = unnest("a", *((f"a_{n}", kind) for n, kind in ATTEMPT_COLUMNS.items()))
    log = insert(attempts_table).from_select(list(ATTEMPT_COLUMNS), select(*logged.c))
    return (
        update(messages_table)
        .where(m.id == rows.c.ids, m.status == Status.SENDING.value, m.attempts == rows.c.seen)
        .where(_locked_in_order())
        .values(
            status=Status.SENT.value,
            updated_at=bindparam("b_now", type_=UTCDateTime()),
            provider_ref=rows.c.refs,
            sent_at=_CLOCK_NOW,
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
    """Park a ``sending`` row until ``now + delay`` (``failure`` says why); the status it got,
    or None if someone else moved it.

    ``now`` is the database's clock (``delivery.core.clock``); ``values`` are further columns to
    set. A short wait stays ``dispatched`` (the task re-runs itself with a countdown, visible in
    Flower as a retry; the lease covers the wait, so a lost retry is recovered by the sweeper
    ``hold_lease`` s after it was due). A long one goes back to the outbox as ``pending``: the
    broker never holds a task longer than ``max_countdown``.
    """
    due = now + dt.timedelta(seconds=delay)
    short = delay <= settings.max_countdown
    status = Status.DISPATCHED if short else Status.PENDING
    # The worker holds a short retry: once due it renews the lease (delivery.sending.leases);
    # if it dies meanwhile, the row comes back hold_lease s after its due time.
    lease_until = due + dt.timedelta(seconds=settings.hold_lease) if short else None
    extra = {} if failure.needs_lookup is None else {"needs_lookup": failure.needs_lookup}
    extra |= _pins(failure)
    done = _finish(
        conn,
        msg,
        status,
        _Event(failure.outcome, failure.code, round(delay, 3)),
        next_attempt_at=due,
        lease_expires_at=lease_until,
        last_error_code=failure.code,
        last_error=failure.reason,
        **extra,
        **values,
    )
    return status if done else None
