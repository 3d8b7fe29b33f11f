"""One clock for every lease and due time: the database's.

Workers, the relay and the sweeper may run on hosts whose clocks disagree; a lease written by
one host and compared by another would then end early (a second send while the first is in
flight) or late. ``db_now`` reads PostgreSQL's ``clock_timestamp()``, so every comparison and
every lease or due time written by the pipeline uses the same clock. The embedded default
(SQLite) is one host, whose clock is the database's.

The hot path pays no round trip of its own for the clock: ``read_with_clock`` reads it in
the same SELECT as the rows an attempt (or a batch) works on, and ``sql_now`` is the clock
as an expression inside the UPDATE that writes it (``sent_at``). ``db_now`` is for the paths
that need the value alone (a parked retry). The relay's claim reads the same server clock as
``statement_timestamp()`` inside its statement: stable for the statement's length, so that
the due index applies.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, Select, func, select
from sqlalchemy.sql.elements import ColumnElement

from delivery.core.models import UTCDateTime, utcnow

__all__ = ["db_now", "read_with_clock", "sql_now"]

_CLOCK = "db_clock_now"


def db_now(conn: Connection) -> dt.datetime:
    """The database's current time, timezone-aware UTC (this host's on SQLite)."""
    if conn.dialect.name != "postgresql":
        return utcnow()
    value = conn.scalar(select(func.clock_timestamp()))
    assert isinstance(value, dt.datetime)
    return value.astimezone(dt.UTC)


def sql_now(conn: Connection) -> ColumnElement[dt.datetime] | dt.datetime:
    """The database's clock as a value to write in an UPDATE or INSERT: PostgreSQL's
    ``clock_timestamp()`` evaluated by the statement itself (no round trip), this host's
    time on SQLite."""
    if conn.dialect.name != "postgresql":
        return utcnow()
    return _CLOCK_NOW


@functools.lru_cache(maxsize=32)
def _with_clock(stmt: Select[Any]) -> Select[Any]:
    return stmt.add_columns(func.clock_timestamp().label(_CLOCK))


#: One object, so that statements built around it can be kept (``transitions.move``).
_CLOCK_NOW = func.clock_timestamp(type_=UTCDateTime())


def read_with_clock(
    conn: Connection, stmt: Select[Any], params: Mapping[str, Any] | None = None
) -> tuple[Sequence[Row[Any]], dt.datetime]:
    """Run ``stmt`` (with ``params``) and read the database's clock in the same round trip:
    its rows and the time (``db_now``'s, read by a second query only when no row came back).
    A statement kept by the caller and run with parameters is extended once."""
    if conn.dialect.name != "postgresql":
        return conn.execute(stmt, params).all(), utcnow()
    rows = conn.execute(_with_clock(stmt), params).all()
    if not rows:
        return rows, db_now(conn)
    value = rows[0]._mapping[_CLOCK]
    assert isinstance(value, dt.datetime)
    return rows, value.astimezone(dt.UTC)
