"""Every page query of the console's message search uses an index on PostgreSQL, read from
``EXPLAIN`` over a large outbox (300,000 rows over four days, partitioned by day as ``delivery
db upgrade`` leaves it): on each partition holding rows an index scan, no sequential scan and
no sort of many rows, whatever the filter (an empty partition, such as a day ahead, costs
nothing to scan and may be read either way)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from delivery import ops
from delivery.core.models import utcnow
from delivery.ops.search import page_query
from delivery.runtime import conversion
from delivery.runtime.db import upgrade
from delivery.testing.fill import fill_outbox
from tests.conftest import own_database

ROWS = 300_000


@pytest.fixture(scope="module")
def big(pg_engine: Engine) -> Iterator[Engine]:
    """An outbox of its own, partitioned by day from five days ago, filled with ROWS messages
    one second apart (each in its day's partition); dropped afterwards."""
    with own_database("plans") as engine:
        upgrade(engine, partition=False)
        conversion.partition(engine, start=utcnow().date() - dt.timedelta(days=5))
        with engine.begin() as conn:
            fill_outbox(conn, ROWS, dt.timedelta(seconds=1))
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
        yield engine


def middle_id(engine: Engine) -> int:
    """The id half way down the outbox: a later page's keyset ``before``."""
    with engine.connect() as conn:
        found = conn.scalar(
            text(f"SELECT id FROM delivery_messages ORDER BY id OFFSET {ROWS // 2} LIMIT 1")
        )
    return int(found)


def scanned_with_rows(engine: Engine, explained: str) -> list[str]:
    """The tables ``explained`` reads sequentially that hold rows."""
    with engine.connect() as conn:
        return [
            table
            for table in re.findall(r"Seq Scan on (\S+)", explained)
            if conn.scalar(text(f"SELECT EXISTS (SELECT 1 FROM {table})"))
        ]


def index_of(engine: Engine, name: str) -> str:
    """The outbox's index that ``name`` is a partition's part of (or ``name`` itself)."""
    with engine.connect() as conn:
        parent = conn.scalar(
            text(
                "SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
                "WHERE i.inhrelid = to_regclass(:n)"
            ),
            {"n": name},
        )
    return str(parent or name)


def plan(engine: Engine, params: dict[str, str], before: int | None = None) -> str:
    with Session(engine) as session:
        query = page_query(session, ops.parse_filter(params), before=before, limit=51)
        compiled = query.compile(dialect=postgresql.dialect())  # type: ignore[no-untyped-call]
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).all()
    return "\n".join(row[0] for row in rows)


SINCE = (utcnow() - dt.timedelta(hours=2)).isoformat()

FILTERS = [
    {},
    {"key": "order-123:receipt"},
    {"key": "order-12345*"},
    {"id": "MIDDLE"},
    {"status": "dead"},
    {"status": "unknown"},
    {"provider": "twilio"},
    {"code": "21211"},
    {"status": "dead", "provider": "twilio", "code": "503"},
    {"type": "otp"},
    {"since": SINCE},
    {"status": "sent", "since": SINCE},
]


@pytest.mark.integration
@pytest.mark.parametrize("params", FILTERS, ids=lambda p: ",".join(p) or "none")
def test_each_page_query_uses_an_index(big: Engine, params: dict[str, str]) -> None:
    """The first page and a later page (keyset ``before``) of this filter are index scans:
    no Seq Scan, and a Sort only of the few rows an index found (a narrow key prefix)."""
    middle = middle_id(big)
    params = {name: str(middle) if value == "MIDDLE" else value for name, value in params.items()}
    for before in (None, middle):
        explained = plan(big, params, before)
        assert scanned_with_rows(big, explained) == [], explained
        for line in explained.splitlines():
            if "Sort  (" in line:  # only a few matching rows may be sorted (narrow prefix)
                rows = int(re.search(r"rows=(\d+)", line).group(1))  # type: ignore[union-attr]
                assert rows < 5000, explained
        # An index, or nothing at all: the planner proved no partition can hold a match.
        assert "Index" in explained or "One-Time Filter: false" in explained, explained


@pytest.mark.integration
def test_prefix_search_finds_exactly_the_prefix(big: Engine) -> None:
    """A key prefix returns only keys that start with it (``_`` and ``%`` are literal), newest
    first."""
    with Session(big) as session:
        page = ops.search(session, ops.parse_filter({"key": "order-1234*"}), limit=200)
        keys = [m.key for m in page.messages]
        assert keys and all(k.startswith("order-1234") for k in keys)
        assert "order-12340:receipt" in keys and "order-1234:receipt" in keys
        assert ops.search(session, ops.parse_filter({"key": "order_1*"})).messages == []


@pytest.mark.integration
@pytest.mark.parametrize(
    ("where", "index"),
    [
        ("last_error_code = $1", "ix_delivery_messages_code_id"),
        ("key = $1", "ix_delivery_messages_key"),
    ],
)
def test_a_generic_plan_can_use_the_index(big: Engine, where: str, index: str) -> None:
    """A prepared statement's generic plan (the value unknown when planned) can still use the
    partial code index (a strict ``= $1`` implies ``IS NOT NULL``) and the key's index (its
    ``varchar_pattern_ops`` has ``=``; on the partitioned outbox it is not unique: the keys
    table is), on each partition holding rows."""
    with big.connect() as conn:
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(
            f"PREPARE matching(text) AS SELECT count(*) FROM delivery_messages WHERE {where}"
        )
        try:
            explained = "\n".join(
                row[0] for row in conn.exec_driver_sql("EXPLAIN EXECUTE matching('21211')")
            )
        finally:
            conn.rollback()  # the prepared statement outlives it: the connection is pooled
            conn.exec_driver_sql("DEALLOCATE matching")
            conn.exec_driver_sql("RESET plan_cache_mode")
            conn.commit()
    used = re.findall(
        r"(?:Index Scan|Index Only Scan) using (\S+)|Bitmap Index Scan on (\S+)", explained
    )
    assert used and {index_of(big, a or b) for a, b in used} == {index}, explained
    assert scanned_with_rows(big, explained) == [], explained
