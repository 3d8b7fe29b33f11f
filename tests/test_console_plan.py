"""Every page query of the console's message search uses an index on PostgreSQL, read from
``EXPLAIN`` over a large outbox (300,000 rows): no sequential scan and no sort of many rows,
whatever the filter."""

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
from delivery.testing.fill import fill_outbox
from tests.factories import OUTBOX_TABLES

ROWS = 300_000


@pytest.fixture(scope="module")
def big(pg_engine: Engine) -> Iterator[Engine]:
    """The suite's PostgreSQL outbox filled with ROWS messages, emptied afterwards."""
    with pg_engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {OUTBOX_TABLES}"))
        fill_outbox(conn, ROWS, dt.timedelta(seconds=1))
    with pg_engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE delivery_messages")
        )
    yield pg_engine
    with pg_engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {OUTBOX_TABLES}"))


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
    {"id": "4242"},
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
    for before in (None, ROWS // 2):
        explained = plan(big, params, before)
        assert "Seq Scan" not in explained, explained
        for line in explained.splitlines():
            if "Sort  (" in line:  # only a few matching rows may be sorted (narrow prefix)
                rows = int(re.search(r"rows=(\d+)", line).group(1))  # type: ignore[union-attr]
                assert rows < 5000, explained
        assert "Index" in explained, explained


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
        ("key = $1", "uq_delivery_messages_key"),
    ],
)
def test_a_generic_plan_can_use_the_index(big: Engine, where: str, index: str) -> None:
    """A prepared statement's generic plan (the value unknown when planned) can still use the
    partial code index (a strict ``= $1`` implies ``IS NOT NULL``) and the key's one unique
    index (its ``varchar_pattern_ops`` has ``=``)."""
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
    assert index in explained, explained
    assert "Seq Scan" not in explained, explained
