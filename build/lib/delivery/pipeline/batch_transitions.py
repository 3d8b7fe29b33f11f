"""The batch path's primitives, each one statement for a whole batch and each fenced per row
like ``transitions.move``:

- ``take_many``: ``dispatched`` -> ``sending``, each row only at the attempt count its reader
  saw;
- ``finish_sent_many``: this attempt's ``sending`` -> ``sent``;
- ``log_attempts``: the attempt rows, one multi-row INSERT.

On PostgreSQL each is one short statement prepared once, whatever the batch's length: the
rows travel as one array per column (``unnest``); SQLite gets one ``move`` per row.
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

from delivery.pipeline.models import UTCDateTime, attempts_table, messages_table, utcnow
from delivery.pipeline.status import Status
from delivery.pipeline.transitions import Sending, finish, move

__all__ = ["Take", "finish_sent_many", "log_attempts", "take_many"]


def log_attempts(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Write many attempt rows (``attempt_row``) in one INSERT; on PostgreSQL one short statement
    prepared once (``INSERT .. SELECT FROM unnest(one array per column)``), not a long VALUES."""
    if rows and conn.dialect.name != "postgresql":
        conn.execute(insert(attempts_table), list(rows))
    elif rows:
        conn.execute(_log_attempts_statement(), {n: [r[n] for r in rows] for n in _ATTEMPT_COLUMNS})


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


@functools.cache
def _log_attempts_statement() -> Any:
    rows = _unnest(*_ATTEMPT_COLUMNS.items())
    return insert(attempts_table).from_select(list(_ATTEMPT_COLUMNS), select(*rows.c))


@dataclass(frozen=True, slots=True)
class Take:
    """One row of a batch as its reader saw it: ``take_many`` takes it only if it is still
    ``dispatched`` at ``seen_attempts``."""

    id: int
    seen_attempts: int


def take_many(
    conn: Connection, rows: Sequence[Take], *, lease_until: dt.datetime, now: dt.datetime
) -> set[int]:
    """``dispatched`` -> ``sending`` for every row of ``rows`` that is still where its reader
    saw it (status and attempt count: each row's own fence), spending one attempt each, in one
    UPDATE; the ids it took. A row another worker moved meanwhile is left alone."""
    if not rows:
        return set()
    if conn.dialect.name != "postgresql":  # SQLite: no arrays to unnest
        return {
            row.id
            for row in rows
            if move(
                conn,
                row.id,
                row.seen_attempts,
                Status.DISPATCHED,
                Status.SENDING,
                attempts=row.seen_attempts + 1,
                lease_expires_at=lease_until,
            )
        }
    stmt = _take_many_statement()
    params = {"ids": [row.id for row in rows], "seen": [row.seen_attempts for row in rows]}
    return set(conn.scalars(stmt, {**params, "b_lease": lease_until, "b_now": now}))


def _unnest(*columns: tuple[str, Any]) -> Any:
    """A table of bound arrays, one column each (``unnest(:a, :b) AS v(a, b)``): one cached
    statement whatever the batch's length."""
    arrays = [bindparam(name, type_=ARRAY(kind)) for name, kind in columns]
    return func.unnest(*arrays).table_valued(*(n for n, _ in columns)).render_derived(name="v")


def _locked_in_order(ids: str) -> Any:
    """``id`` is one of the bound array ``ids``, locked in id order (overlapping batches wait,
    never deadlock), the locking subquery run once (``= ANY(ARRAY(..))``; under ``IN`` it ran
    once per ``dispatched`` row: 2 s per take with 5,000 queued, stale statistics)."""
    m = messages_table.c
    wanted = m.id == any_(bindparam(ids, type_=ARRAY(BigInteger())))
    locked = select(m.id).where(wanted).order_by(m.id).with_for_update()
    return m.id == any_(func.array(locked.scalar_subquery()))


@functools.cache
def _take_many_statement() -> Any:
    m = messages_table.c
    seen = _unnest(("ids", BigInteger()), ("seen", Integer()))
    return (
        update(messages_table)
        .where(m.id == seen.c.ids, m.status == Status.DISPATCHED.value, m.attempts == seen.c.seen)
        .where(_locked_in_order("ids"))
        .values(
            status=Status.SENDING.value,
            attempts=seen.c.seen + 1,
            lease_expires_at=bindparam("b_lease", type_=UTCDateTime()),
            updated_at=bindparam("b_now", type_=UTCDateTime()),
        )
        .returning(m.id)
    )


def finish_sent_many(
    conn: Connection, sent: Sequence[tuple[Sending, str | None]], sent_at: Any
) -> set[int]:
    """This attempt's ``sending`` -> ``sent`` (with the provider's reference) for every
    message of ``sent``, fenced per row on its attempt, in one UPDATE; the ids it moved.
    ``sent_at``: the time to store (``delivery.pipeline.clock.sql_now``)."""
    if not sent:
        return set()
    done: dict[str, Any] = dict(
        sent_at=sent_at,
        lease_expires_at=None,
        needs_lookup=False,
        last_error_code=None,
        last_error=None,
    )
    if conn.dialect.name != "postgresql":
        return {
            msg.id for msg, ref in sent if finish(conn, msg, Status.SENT, provider_ref=ref, **done)
        }
    params = {
        "ids": [msg.id for msg, _ in sent],
        "seen": [msg.attempt for msg, _ in sent],
        "refs": [ref for _, ref in sent],
        "b_now": utcnow(),
    }
    return set(conn.scalars(_sent_many_statement(sent_at), params))


@functools.lru_cache(maxsize=4)
def _sent_many_statement(sent_at: Any) -> Any:
    """Kept per ``sent_at`` (on PostgreSQL always ``sql_now``'s one expression object)."""
    m = messages_table.c
    rows = _unnest(("ids", BigInteger()), ("seen", Integer()), ("refs", String()))
    return (
        update(messages_table)
        .where(m.id == rows.c.ids, m.status == Status.SENDING.value, m.attempts == rows.c.seen)
        .where(_locked_in_order("ids"))
        .values(
            status=Status.SENT.value,
            updated_at=bindparam("b_now", type_=UTCDateTime()),
            provider_ref=rows.c.refs,
            sent_at=sent_at,
            lease_expires_at=None,
            needs_lookup=False,
            last_error_code=None,
            last_error=None,
        )
        .returning(m.id)
    )
