"""The one fenced UPDATE every transition of a message is made of (``move``; the fence rule is
the room's, ``delivery.transitions``). ``move_where`` adds a condition (the sweeper's "its
lease has passed"). Each statement is kept per shape (the set of columns it writes): built
per call, its cache key cost about as much as the statement's round trip.

The statements over many rows at once (PostgreSQL) bind arrays: ``unnest`` makes a table of
them, and ``among`` is how such a statement names its messages (or their attempts and
receipts) by id, so that an outbox partitioned by day reads only those ids' days.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import (
    BigInteger,
    ClauseElement,
    ColumnElement,
    Connection,
    and_,
    any_,
    bindparam,
    func,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from delivery.core.models import messages_table, utcnow
from delivery.core.status import Status

__all__ = ["among", "among_params", "move", "move_where", "unnest"]


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
    """The conditional UPDATE behind ``move`` (and the sweeper's ``recovery.recover``): the
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


def unnest(name: str, *columns: tuple[str, Any]) -> Any:
    """A table of bound arrays, one column each (``unnest(:a, :b) AS name(a, b)``): one
    statement over many rows, whatever their number (PostgreSQL)."""
    arrays = [bindparam(column, type_=ARRAY(kind)) for column, kind in columns]
    return func.unnest(*arrays).table_valued(*(n for n, _ in columns)).render_derived(name=name)


def among(column: Any, name: str) -> Any:
    """``column`` (a message id) is one of the bound array ``name``, and between its lowest and
    highest (``name_low``, ``name_high``): bind all three with ``among_params`` (PostgreSQL).

    On an outbox partitioned by day (an id carries its day: ``delivery.runtime.partitions``)
    PostgreSQL then plans and reads only the days of those ids: ``= ANY`` of the array prunes
    when the statement is planned for its values, the range when a prepared statement's
    generic plan starts. A join on the array, or a subquery of it, prunes nothing: every day
    would be planned, and its index probed for every id (3.3 times the time per statement at
    40 days, measured)."""
    big = BigInteger()
    return and_(
        column == any_(bindparam(name, type_=ARRAY(big))),
        column >= bindparam(f"{name}_low", type_=big),
        column <= bindparam(f"{name}_high", type_=big),
    )


def among_params(name: str, ids: Iterable[int]) -> dict[str, Any]:
    """The parameters of ``among(.., name)`` for ``ids`` (at least one)."""
    listed = list(ids)
    return {name: listed, f"{name}_low": min(listed), f"{name}_high": max(listed)}
