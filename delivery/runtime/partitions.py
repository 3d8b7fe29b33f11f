"""A PostgreSQL outbox partitioned by day, so that retention drops a day instead of deleting
its rows one by one ([docs/operations.md](../../docs/operations.md#retention)).

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
the keys table's unique index, as it was the outbox's.

``partition(engine)`` converts an outbox that is not partitioned yet: the existing tables
become one partition each (up to the end of today; their rows age out and are dropped with
it), after the work that can run beside the pipeline (the keys, the indexes a partition needs,
constraints that spare ``ATTACH`` its scan); then one short transaction swaps the tables.
``ensure_ahead`` creates the coming days' partitions (beat, every hour; ``delivery db
partition``); ``drop_day`` drops a day whose every message ``prune`` would delete.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import time
from collections.abc import Callable, Sequence

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

__all__ = [
    "AHEAD",
    "KEYS_TABLE",
    "TABLES",
    "Conversion",
    "Day",
    "Dropped",
    "day_of",
    "drop_day",
    "ensure_ahead",
    "is_partitioned",
    "listing",
    "partition",
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
_SHIFT = 32
#: How long a swap or a drop waits for a lock before it gives up (and tries again later):
#: shorter than ``deadlock_timeout`` (1 s), so that it, never a worker, is the one to give up.
_LOCK_TIMEOUT = "500ms"
_EPOCH = dt.date(1970, 1, 1)
_LOCK_NOT_AVAILABLE = "55P03"

_FUNCTIONS = """
CREATE OR REPLACE FUNCTION delivery_message_id(at timestamptz) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT (floor(extract(epoch FROM at) / 86400)::bigint << 32)
         | (nextval('{sequence}'::regclass) & 4294967295)
$$;
CREATE OR REPLACE FUNCTION delivery_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  owner bigint;
BEGIN
  INSERT INTO delivery_keys (key, message_id) VALUES (NEW.key, NEW.id)
    ON CONFLICT (key) DO NOTHING;
  IF FOUND THEN
    RETURN NEW;
  END IF;
  -- Taken: by a message that exists (skip this row, as ON CONFLICT DO NOTHING does), or by
  -- one that a prune dropped with its day (take the key over).
  SELECT k.message_id INTO owner FROM delivery_keys k WHERE k.key = NEW.key FOR UPDATE;
  IF EXISTS (SELECT 1 FROM delivery_messages m WHERE m.id = owner) THEN
    RETURN NULL;
  END IF;
  UPDATE delivery_keys SET message_id = NEW.id WHERE key = NEW.key;
  RETURN NEW;
END $$;
"""
_KEYS = """
CREATE TABLE IF NOT EXISTS delivery_keys (
  key varchar(255) NOT NULL CONSTRAINT pk_delivery_keys PRIMARY KEY,
  message_id bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_delivery_keys_message_id ON delivery_keys (message_id);
"""
#: Indexes each existing table needs as a partition (built beside the pipeline, before the
#: swap): a partitioned table's unique indexes hold its partition key.
_PARTITION_INDEXES = {
    "delivery_messages": [
        "ix_delivery_messages_key ON delivery_messages (key varchar_pattern_ops)",
    ],
    "delivery_attempts": ["pk_delivery_attempts ON delivery_attempts (id, message_id)"],
    "delivery_receipts": [
        "pk_delivery_receipts ON delivery_receipts (id, message_id)",
        "uq_delivery_receipts_provider ON delivery_receipts (provider, event, message_id)",
    ],
}
#: The indexes of the existing tables the partitioned ones do without: the keys table holds
#: key uniqueness; the others are replaced by those above.
_REPLACED = {
    "uq_delivery_messages_key",
    "pk_delivery_attempts",
    "pk_delivery_receipts",
    "uq_delivery_receipts_provider",
}


def day_of(when: dt.datetime | dt.date) -> int:
    """The day number (days since 1970-01-01, UTC) of a time or a date."""
    if isinstance(when, dt.datetime):
        when = when.astimezone(dt.UTC).date()
    return (when - _EPOCH).days


def _bound(day: int) -> int:
    return day << _SHIFT


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
            _EPOCH + dt.timedelta(days=self.high >> _SHIFT), dt.time(), dt.UTC
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


@dataclasses.dataclass(frozen=True, slots=True)
class Conversion:
    """What ``partition`` did: the keys written beside the pipeline, and how long the swap
    held the outbox's tables (the pipeline's one pause)."""

    keys: int
    pause_s: float
    created: list[str]


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


def _today(conn: Connection) -> int:
    return int(conn.scalar(text("SELECT (now() AT TIME ZONE 'UTC')::date - date '1970-01-01'")))


def ensure_ahead(engine: Engine, days: int = AHEAD) -> list[str]:
    """Create the partitions of today and the next ``days`` days that are missing (beat does,
    every hour); return their names. Nothing on an outbox that is not partitioned."""
    with engine.connect() as conn:
        if not is_partitioned(conn):
            return []
        today = _today(conn)
    return _create_days(engine, range(today, today + days + 1))


def _create_days(engine: Engine, days: range) -> list[str]:
    created = []
    for day in days:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'"))
            if name := _create_day(conn, day):
                created.append(name)
    return created


def _index_names(conn: Connection, table: str) -> list[str]:
    return list(
        conn.scalars(text("SELECT indexname FROM pg_indexes WHERE tablename = :t"), {"t": table})
    )


def partition(
    engine: Engine,
    *,
    start: dt.date | None = None,
    batch: int = 50_000,
    say: Callable[[str], None] = lambda _: None,
) -> Conversion:
    """Convert the outbox of ``engine`` (PostgreSQL, at the newest revision, not partitioned)
    to the partitioned shape; the pipeline may run meanwhile. ``say`` is told each step.

    The existing rows become the first partition, which ends where the first day begins:
    tomorrow, or ``start`` (an earlier date gives an empty outbox the past days a test or a
    benchmark fills: ``delivery.testing.fill``)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if is_partitioned(conn):
            raise ValueError("the outbox is already partitioned")
        sequence = conn.scalar(text("SELECT pg_get_serial_sequence('delivery_messages', 'id')"))
        today = _today(conn)
        first_day = today + 1 if start is None else min(day_of(start), today + 1)
        high = _bound(first_day)
        say("keys table and functions")
        conn.execute(text(_KEYS))
        conn.execute(text(_FUNCTIONS.format(sequence=sequence)))
        for table, column in TABLES:
            say(f"{table}: check that every row is before {high}")
            conn.execute(
                text(
                    f"ALTER TABLE {table} ADD CONSTRAINT {table}_p0_bound "
                    f"CHECK ({column} < {high}) NOT VALID"
                )
            )
            conn.execute(text(f"ALTER TABLE {table} VALIDATE CONSTRAINT {table}_p0_bound"))
            for index in _PARTITION_INDEXES[table]:
                name, definition = index.split(" ", 1)
                say(f"{table}: index {name}_p0")
                conn.execute(
                    text(
                        f"CREATE {_unique(index)}INDEX CONCURRENTLY IF NOT EXISTS "
                        f"{name}_p0 {definition}"
                    )
                )
        say("keys of the existing messages")
        # From here on each new message claims its key; then every earlier one's is recorded
        # (a key claimed meanwhile for a message its unique index refused is corrected).
        conn.execute(text("SET lock_timeout = '5s'"))
        conn.execute(text(_TRIGGER))
        conn.execute(text("RESET lock_timeout"))
        top = conn.scalar(text("SELECT max(id) FROM delivery_messages")) or 0
        keys, last = 0, 0
        while last < top:
            last, done = conn.execute(
                text(_BACKFILL), {"last": last, "top": top, "batch": batch}
            ).one()
            keys += done
    say("swap (the pipeline waits)")
    pause, created = _swap(engine, range(first_day, today + AHEAD + 1))
    return Conversion(keys, pause, created)


_TRIGGER = (
    "CREATE TRIGGER delivery_claim_key BEFORE INSERT ON delivery_messages "
    "FOR EACH ROW EXECUTE FUNCTION delivery_claim_key()"
)
_BACKFILL = """
WITH b AS (
  SELECT key, id FROM delivery_messages WHERE id > :last AND id <= :top ORDER BY id LIMIT :batch
), k AS (
  INSERT INTO delivery_keys (key, message_id) SELECT key, id FROM b
  ON CONFLICT (key) DO UPDATE SET message_id = EXCLUDED.message_id
  WHERE NOT EXISTS (SELECT 1 FROM delivery_messages m WHERE m.id = delivery_keys.message_id)
  RETURNING 1
)
SELECT coalesce((SELECT max(id) FROM b), :top), (SELECT count(*) FROM k)
"""


def _swap(engine: Engine, days: range) -> tuple[float, list[str]]:
    high = _bound(days.start)
    with engine.begin() as conn:
        conn.execute(text(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'"))
        conn.execute(text("SET LOCAL statement_timeout = '60s'"))
        tables = ", ".join(table for table, _ in TABLES)
        started = time.monotonic()
        conn.execute(text(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE"))
        conn.execute(text("DROP TRIGGER delivery_claim_key ON delivery_messages"))
        for table, column in TABLES:
            _swap_table(conn, table, column, high)
        conn.execute(
            text(
                "ALTER TABLE delivery_messages ALTER COLUMN id "
                "SET DEFAULT delivery_message_id(now())"
            )
        )
        conn.execute(text(_TRIGGER))
        pause = time.monotonic() - started
    return pause, _create_days(engine, days)


def _swap_table(conn: Connection, table: str, column: str, high: int) -> None:
    """``table`` becomes ``{table}_p0``, the first partition of a new ``table``, with the
    indexes built for it beforehand (``_PARTITION_INDEXES``)."""
    old = f"{table}_p0"
    indexes = {
        name: conn.scalar(text("SELECT pg_get_indexdef(to_regclass(:n))"), {"n": name})
        for name in _index_names(conn, table)
        if not name.endswith("_p0")
    }
    for fk in conn.scalars(
        text(
            "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:t) AND contype = 'f'"
        ),
        {"t": table},
    ):
        conn.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT {fk}"))
    conn.execute(text(f"ALTER TABLE {table} RENAME TO {old}"))
    kept = {}
    for name, definition in indexes.items():
        if name in _REPLACED and name.startswith("pk_"):
            conn.execute(text(f"ALTER TABLE {old} DROP CONSTRAINT {name}"))
        elif name in _REPLACED:
            conn.execute(text(f"DROP INDEX {name}"))
        elif name == f"pk_{table}":
            conn.execute(text(f"ALTER TABLE {old} RENAME CONSTRAINT {name} TO {name}_p0"))
        else:
            conn.execute(text(f"ALTER INDEX {name} RENAME TO {name}_p0"))
            kept[name] = definition
    key = "id" if table == "delivery_messages" else f"id, {column}"
    conn.execute(
        text(
            f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE ({column}); "
            f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({key})"
        )
    )
    for definition in kept.values():
        conn.execute(text(definition.replace(f" ON public.{table} ", f" ON {table} ")))
    for index in _PARTITION_INDEXES[table]:
        if not index.startswith("pk_"):
            conn.execute(text(f"CREATE {_unique(index)}INDEX {index}"))
    sequence = conn.scalar(text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": old})
    conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY {table}.id"))
    conn.execute(
        text(
            f"ALTER TABLE {table} ATTACH PARTITION {old} FOR VALUES FROM (MINVALUE) TO ({high}); "
            f"ALTER TABLE {old} DROP CONSTRAINT {table}_p0_bound"
        )
    )


def _unique(index: str) -> str:
    return "" if index.startswith("ix_") else "UNIQUE "


def _create_day(conn: Connection, day: int) -> str | None:
    """Create the partitions of ``day`` unless its ids have one (its own, or the first one's,
    which ends where the first day begins); the new messages partition's name. Each table is
    created empty and attached: ``ATTACH`` takes a lock that lets the pipeline go on
    (``CREATE .. PARTITION OF`` would stop it)."""
    low, high = _bound(day), _bound(day + 1)
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
    engine: Engine, day: Day, cutoff: dt.datetime, finals: Sequence[str], *, dry_run: bool = False
) -> Dropped:
    """Drop ``day`` (its messages, attempts and receipts) if ``prune`` would delete every
    message in it (a status of ``finals``, last changed before ``cutoff``); else keep it and
    say why. Its keys are then deleted (a key of a dropped message is free again). With
    ``dry_run``, say what would happen."""
    suffix = day.suffix
    try:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'"))
            # Nobody changes a row of this day from here on (a redrive waits, then finds none).
            conn.execute(text(f"LOCK TABLE {day.name} IN SHARE MODE"))
            kept: dict[str, int] = dict(
                conn.execute(
                    text(
                        f"SELECT status, count(*) FROM {day.name} "
                        "WHERE NOT (status = ANY(:finals)) GROUP BY status"
                    ),
                    {"finals": list(finals)},
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
        if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
            raise
        return Dropped(day, False, kept={"busy": 1})
    with engine.begin() as conn:
        low = "" if day.low is None else f"message_id >= {day.low} AND "
        conn.execute(text(f"DELETE FROM delivery_keys WHERE {low}message_id < {day.high}"))
    return Dropped(day, True, messages, attempts)
