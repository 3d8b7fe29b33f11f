"""One clock for every lease and due time: the database's.

Workers, the relay and the sweeper may run on hosts whose clocks disagree; a lease written by
one host and compared by another would then end early (a second send while the first is in
flight) or late. ``db_now`` reads PostgreSQL's ``clock_timestamp()``, so every comparison and
every lease or due time written by the pipeline uses the same clock. The embedded default
(SQLite) is one host, whose clock is the database's.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection, func, select

from delivery.pipeline.models import utcnow

__all__ = ["db_now"]


def db_now(conn: Connection) -> dt.datetime:
    """The database's current time, timezone-aware UTC (this host's on SQLite)."""
    if conn.dialect.name != "postgresql":
        return utcnow()
    value = conn.scalar(select(func.clock_timestamp()))
    assert isinstance(value, dt.datetime)
    return value.astimezone(dt.UTC)
