"""A PostgreSQL outbox partitioned by day, so that retention drops a day instead of deleting
its rows one by one ([docs/operations.md](../../docs/operations.md#retention-partitioned-by-day)).

The shape. ``delivery_messages`` is partitioned by range of ``id``, and a message's id carries
the UTC day it was inserted on: ``day << 32 | n`` (``delivery_message_id``, the column's
default; ``n`` from the table's own sequence). Its attempts and receipts are partitioned by
``message_id`` with the same bounds, so a day of messages and everything about them are three
tables, dropped together. Every lookup the pipeline makes is by id, and an id names its one
partition: nothing else changes for the code above (models, queries, the console's keyset
pages). Partitioning by ``created_at`` instead would make every ``WHERE id = ..`` probe every
partition.

Idempotency keys. A unique index of a partitioned table must hold the partition key, so key
uniqueness moves to ``delivery_keys`` (key, message_id), filled by a trigger on each insert
into the outbox: the trigger skips the row when its key is taken by a message that exists,
exactly as ``ON CONFLICT DO NOTHING`` did (the one ``INSERT`` of ``delivery.outbox.insert``
works on both shapes), and takes the key over from a message that was dropped. Concurrency is
the keys table's unique index, as it was the outbox's. A dropped day's keys are deleted after
the drop, in batches (``free_keys``, beat every hour).

``delivery.runtime.conversion.partition`` converts an outbox that is not partitioned yet.
``ensure_ahead`` creates the coming days' partitions (beat, every hour; ``delivery db
partition``); ``drop_day`` drops a day whose every message ``prune`` would delete.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import re
from collections.abc import Sequence

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

__all__ = [
    "AHEAD",
    "KEYS_TABLE",
    "LOCK_TIMEOUT",
    "SHIFT",
    "TABLES",
    "Day",
    "Dropped",
    "bound",
    "create_days",
    "day_of",
    "days_ahead",
    "drop_day",
    "ensure_ahead",
    "first_id",
    "free_keys",
    "is_partitioned",
    "listing",
    "lock_not_available",
    "today_of",
]

#: The outbox's partitioned tables and the column each is partitioned by (messages first).
TABLES = (
    ("delivery_messages", "id"),
    ("delivery_attempts", "message_id"),
    ("delivery_receipts", "message_id"),
)
#: The table of a partitioned outbox's idempotency keys (one row per message).
KEYS_TABLE = "delivery_keys"
#: Days of partitions kept ready beyond today.
AHEAD = 7
#: Bits of an id below its day: ``day << SHIFT | n``.
SHIFT = 32
#: How long a swap or a drop waits for a lock before it gives up (and tries again later):
#: shorter than ``deadlock_timeout`` (1 s), so that it, never a worker, is the one to give up.
LOCK_TIMEOUT = "500ms"
_EPOCH = dt.date(1970, 1, 1)
_LOCK_NOT_AVAILABLE = "55P03"


def day_of(when: dt.datetime | dt.date) -> int:
    """The day number (days since 1970-01-01, UTC) of a time or a date."""
    if isinstance(when, dt.datetime):
        when = when.astimezone(dt.UTC).date()
    return (when - _EPOCH).days


def bound(day: int) -> int:
    """The first id of ``day``."""
    return day << SHIFT


@dataclasses.dataclass(frozen=True, slots=True)
class Day:
    """One partition of ``delivery_messages`` (with the attempts' and receipts' of the same
    name): ``ends`` is the first moment its ids are not for (midnight UTC); the first one,
    ``p0``, holds every row from before the outbox was partitioned."""

    name: str
    low: int | None
    high: int

    @property
    def suffix(self) -> str:
        return self.name.removeprefix("delivery_messages_")

    @property
    def ends(self) -> dt.datetime:
        return dt.datetime.combine(
            _EPOCH + dt.timedelta(days=self.high >> SHIFT), dt.time(), dt.UTC
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Dropped:
    """What ``drop_day`` did with one day: ``dropped`` it (or would, in a dry run: its
    ``messages`` and ``attempts``), or kept it because of the messages ``prune`` would not
    delete (``kept``: their count per status, and ``changed``: final messages changed since
    the cutoff), or because its tables stayed locked (``busy``: tried again next time)."""

    day: Day
    dropped: bool
    messages: int = 0
    attempts: int = 0
    kept: dict[str, int] = dataclasses.field(default_factory=dict)


def lock_not_available(exc: OperationalError) -> bool:
    """Whether ``exc`` is a wait for a lock that outlasted ``LOCK_TIMEOUT``."""
    return getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE


def is_partitioned(conn: Connection) -> bool:
    """Whether ``conn``'s outbox is the partitioned shape (never on SQLite)."""
    if conn.dialect.name != "postgresql":
        return False
    return bool(
        conn.scalar(
            text(
                "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table "
                "WHERE partrelid = to_regclass('delivery_messages'))"
            )
        )
    )


_BOUND = re.compile(r"FROM \((MINVALUE|'?-?\d+'?)\) TO \('?(-?\d+)'?\)")


def listing(conn: Connection) -> list[Day]:
    """The partitions of ``delivery_messages``, oldest first."""
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass('delivery_messages')"
        )
    )
    days = []
    for name, bound in rows:
        found = _BOUND.search(bound)
        if found is None:  # pragma: no cover - only ranges are created
            raise RuntimeError(f"{name}: unexpected partition bound {bound}")
        low = None if found[1] == "MINVALUE" else int(found[1].strip("'"))
        days.append(Day(name, low, int(found[2])))
    return sorted(days, key=lambda day: day.high)


def first_id(conn: Connection, since: dt.datetime) -> int | None:
    """On a partitioned outbox, the lowest id a message created at or after ``since`` can
    have (a day early: the id's day is the database's clock at the insert, ``created_at`` the
    app's), so that a search by time reads only the days since; None when that cannot be
    said (not partitioned, or ``since`` before the end of the first partition, whose rows may
    have been written before ids carried their day)."""
    if not is_partitioned(conn):
        return None
    days = listing(conn)
    if not days or since < days[0].ends:
        return None
    return bound(day_of(since) - 1)


def today_of(conn: Connection) -> int:
    """The database's today, as a day number."""
    return int(conn.scalar(text("SELECT (now() AT TIME ZONE 'UTC')::date - date '1970-01-01'")))


def days_ahead(conn: Connection) -> int | None:
    """On a partitioned outbox, how many days after today can take new messages (their
    partitions exist; beat keeps ``AHEAD``): at -1 an ``enqueue`` fails. None on any other
    outbox."""
    if not is_partitioned(conn):
        return None
    days = listing(conn)
    last = (days[-1].high - 1) >> SHIFT if days else -1
    return max(last - today_of(conn), -1)


def ensure_ahead(engine: Engine, days: int = AHEAD) -> list[str]:
    """Create the partitions of today and the next ``days`` days that are missing (beat does,
    every hour); return their names. Nothing on an outbox that is not partitioned."""
    with engine.connect() as conn:
        if not is_partitioned(conn):
            return []
        today = today_of(conn)
    return create_days(engine, range(today, today + days + 1))


def create_days(engine: Engine, days: range) -> list[str]:
    """Create the partitions of ``days`` that are missing, each in its own transaction."""
    created = []
    for day in days:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            if name := _create_day(conn, day):
                created.append(name)
    return created


def _create_day(conn: Connection, day: int) -> str | None:
    """Create the partitions of ``day`` unless its ids have one (its own, or the first one's,
    which ends where the first day begins); the new messages partition's name. Each table is
    created empty and attached: ``ATTACH`` takes a lock that lets the pipeline go on
    (``CREATE .. PARTITION OF`` would stop it)."""
    low, high = bound(day), bound(day + 1)
    if any((have.low is None or have.low < high) and low < have.high for have in listing(conn)):
        return None
    name = f"p{(_EPOCH + dt.timedelta(days=day)):%Y%m%d}"
    for table, _ in TABLES:
        conn.execute(
            text(
                f"CREATE TABLE {table}_{name} (LIKE {table} INCLUDING DEFAULTS); "
                f"ALTER TABLE {table} ATTACH PARTITION {table}_{name} "
                f"FOR VALUES FROM ({low}) TO ({high})"
            )
        )
    return f"delivery_messages_{name}"


def drop_day(
    engine: Engine,
    day: Day,
    cutoff: dt.datetime,
    finals: Sequence[str],
    *,
    others: Sequence[str],
    dry_run: bool = False,
) -> Dropped:
    """Drop ``day`` (its messages, attempts and receipts) if ``prune`` would delete every
    message in it (a status of ``finals``, last changed before ``cutoff``); else keep it and
    say why (its messages of ``others``, every status but the final ones, and those changed
    since). Both are found through the status index, so a day's size does not count. Its
    keys are left to ``free_keys``. With ``dry_run``, say what would happen."""
    suffix = day.suffix
    try:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            # Nobody changes a row of this day from here on (a redrive waits, then finds none).
            conn.execute(text(f"LOCK TABLE {day.name} IN SHARE MODE"))
            kept: dict[str, int] = dict(
                conn.execute(
                    text(
                        f"SELECT status, count(*) FROM {day.name} "
                        "WHERE status = ANY(:others) GROUP BY status"
                    ),
                    {"others": list(others)},
                ).all()
            )
            changed = conn.scalar(
                text(
                    f"SELECT count(*) FROM {day.name} "
                    "WHERE status = ANY(:finals) AND updated_at >= :cutoff"
                ),
                {"finals": list(finals), "cutoff": cutoff},
            )
            if changed:
                kept["changed"] = int(changed)
            if kept:
                return Dropped(day, False, kept=kept)
            messages = int(conn.scalar(text(f"SELECT count(*) FROM {day.name}")) or 0)
            attempts = int(
                conn.scalar(text(f"SELECT count(*) FROM delivery_attempts_{suffix}")) or 0
            )
            if dry_run:
                return Dropped(day, True, messages, attempts)
            conn.execute(
                text(
                    f"DROP TABLE delivery_receipts_{suffix}, delivery_attempts_{suffix}, {day.name}"
                )
            )
    except OperationalError as exc:
        if not lock_not_available(exc):
            raise
        return Dropped(day, False, kept={"busy": 1})
    return Dropped(day, True, messages, attempts)


def free_keys(engine: Engine, *, batch: int = 10_000) -> int:
    """Delete the keys of dropped days' messages (their ids lie in no partition), ``batch``
    at a time, each batch its own transaction; how many. ``drop_day`` leaves them, so that a
    prune takes as long whatever its days hold (the key of a dropped message is free all the
    same: the next enqueue of it takes it over); beat frees them every hour."""
    with engine.connect() as conn:
        if not is_partitioned(conn):
            return 0
        days = listing(conn)
    gaps: list[str] = []
    if days and days[0].low is not None:
        gaps.append(f"message_id < {days[0].low}")
    for before, after in itertools.pairwise(days):
        if after.low is not None and before.high < after.low:
            gaps.append(f"message_id >= {before.high} AND message_id < {after.low}")
    freed = 0
    for gap in gaps:
        while True:
            with engine.begin() as conn:
                done = conn.execute(
                    text(
                        "DELETE FROM delivery_keys WHERE ctid = ANY(ARRAY("
                        f"SELECT ctid FROM delivery_keys WHERE {gap} LIMIT {int(batch)}))"
                    )
                ).rowcount
            freed += done
            if done < batch:
                break
    return freed
