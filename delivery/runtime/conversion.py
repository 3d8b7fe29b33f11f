"""The conversion of an existing PostgreSQL outbox to the shape partitioned by day
(``delivery.runtime.partitions``), while the pipeline runs: ``delivery db partition``, and
``delivery db upgrade`` on a new outbox.

Beside the pipeline: the keys table and its trigger (from then on each new message claims its
key), every existing message's key, the indexes the existing tables need as partitions
(``CREATE INDEX CONCURRENTLY``), and ``CHECK`` constraints that spare ``ATTACH`` its scan.
Then one short transaction swaps the tables: each becomes the first partition, ``p0``, of a
new partitioned table of its name (catalog changes only). The coming days' partitions are
created after it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import time
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from delivery.runtime.partitions import (
    AHEAD,
    LOCK_TIMEOUT,
    SHIFT,
    TABLES,
    bound,
    create_days,
    day_of,
    is_partitioned,
    lock_not_available,
    today_of,
)

__all__ = ["Conversion", "partition"]


@dataclasses.dataclass(frozen=True, slots=True)
class Conversion:
    """What ``partition`` did: the keys of the existing messages it recorded, how long the
    swap held the outbox's tables (the pipeline's one pause), the days it created."""

    keys: int
    pause_s: float
    created: list[str]


_FUNCTIONS = """
CREATE OR REPLACE FUNCTION delivery_message_id(at timestamptz) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT (floor(extract(epoch FROM at) / 86400)::bigint << {shift})
         | (nextval('{sequence}'::regclass) & {mask})
$$;
CREATE OR REPLACE FUNCTION delivery_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  owner bigint;
BEGIN
  LOOP
    INSERT INTO delivery_keys (key, message_id) VALUES (NEW.key, NEW.id)
      ON CONFLICT (key) DO NOTHING;
    IF FOUND THEN
      RETURN NEW;
    END IF;
    -- Taken: by a message that exists (skip this row, as ON CONFLICT DO NOTHING does), or
    -- by one that a prune dropped with its day (take the key over). A key freed meanwhile
    -- (partitions.free_keys) is claimed again.
    SELECT k.message_id INTO owner FROM delivery_keys k WHERE k.key = NEW.key FOR UPDATE;
    IF FOUND THEN
      IF EXISTS (SELECT 1 FROM delivery_messages m WHERE m.id = owner) THEN
        RETURN NULL;
      END IF;
      UPDATE delivery_keys SET message_id = NEW.id WHERE key = NEW.key;
      RETURN NEW;
    END IF;
  END LOOP;
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


def functions(conn: Connection) -> None:
    """Create, or bring up to date, the partitioned outbox's functions: the message id of a
    day (on the outbox's own sequence) and the key trigger's. ``delivery db upgrade`` runs
    this on an outbox partitioned already."""
    sequence = conn.scalar(text("SELECT pg_get_serial_sequence('delivery_messages', 'id')"))
    conn.execute(text(_FUNCTIONS.format(sequence=sequence, shift=SHIFT, mask=(1 << SHIFT) - 1)))


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
        today = today_of(conn)
        first_day = today + 1 if start is None else min(day_of(start), today + 1)
        high = bound(first_day)
        say("keys table and functions")
        conn.execute(text(_KEYS))
        functions(conn)
        for table, column in TABLES:
            say(f"{table}: check that every row is before {high}")
            conn.execute(
                text(
                    f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_p0_bound; "
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
    for tries in itertools.count(1):
        say("swap (the pipeline waits)")
        try:
            pause, created = _swap(engine, range(first_day, today + AHEAD + 1))
            return Conversion(keys, pause, created)
        except OperationalError as exc:
            if not lock_not_available(exc) or tries == _SWAP_TRIES:
                raise
            say(f"the outbox stayed busy for {LOCK_TIMEOUT}: the swap waits a second, again")
            time.sleep(1.0)
    raise AssertionError("unreachable")  # pragma: no cover - itertools.count never ends


#: How many times the swap asks for the outbox's locks (each wait at most ``LOCK_TIMEOUT``)
#: before the conversion fails (all it did is kept: run it again).
_SWAP_TRIES = 20
_TRIGGER = (
    "CREATE OR REPLACE TRIGGER delivery_claim_key BEFORE INSERT ON delivery_messages "
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
    high = bound(days.start)
    with engine.begin() as conn:
        conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
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
    return pause, create_days(engine, days)


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
