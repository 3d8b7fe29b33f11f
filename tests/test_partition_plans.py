"""Issue 29: on an outbox partitioned by day, the statements the pipeline runs over many
messages at once (a worker's batch: its read, take and finish; the relay's claim, once it
picked its rows; a lease renewal; a batch of receipts' moves) read only the days of those
messages (``delivery.transitions.fence.among``), whether PostgreSQL plans them for their
values or runs a prepared statement's generic plan. A statement that reads every day's index
for every id costs 3.3 times as much at 40 days.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql as psql
from sqlalchemy import Engine, event, func, insert

from delivery.core.models import messages_table
from delivery.observability.events import tell_outcomes_after
from delivery.relay.claims import claim
from delivery.runtime import conversion
from delivery.runtime.current import get_settings
from delivery.runtime.db import upgrade
from delivery.runtime.service import Service
from delivery.sending.leases import renew_held
from delivery.sending.sender import deliver_many
from delivery.transitions import Action
from delivery.transitions.receipts import ReceiptEvent, record_many
from tests.conftest import own_database
from tests.factories import message_values

pytestmark = pytest.mark.integration

#: A scan of one day's table, as EXPLAIN names it.
_SCANNED = re.compile(r"Scan .*\bon (delivery_(?:messages|attempts|receipts)_p\d+)")


@pytest.fixture
def outbox(pg_engine: Engine) -> Iterator[Engine]:
    """A database of this test's own, partitioned by day from six days ago."""
    with own_database("plans") as engine:
        upgrade(engine, partition=False)
        today = dt.datetime.now(dt.UTC).date()
        conversion.partition(engine, start=today - dt.timedelta(days=6))
        yield engine


def _add(engine: Engine, key: str, status: str, at: dt.datetime) -> int:
    """A message inserted at ``at`` (an id of that day)."""
    values = message_values(key, status, created_at=at, updated_at=at)
    if status == "dispatched":
        values["lease_expires_at"] = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with engine.begin() as conn:
        return int(
            conn.execute(
                insert(messages_table)
                .values(id=func.delivery_message_id(at), **values)
                .returning(messages_table.c.id)
            ).scalar_one()
        )


def _scanned(engine: Engine, statement: str, params: dict[str, Any], generic: bool) -> set[str]:
    """The day tables ``statement`` scans with ``params``: as planned for those values, or
    (``generic``) in its prepared statement's generic plan, pruned as it starts. Rolled
    back."""
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        with raw.cursor() as cur:
            if not generic:
                plan = cur.execute("EXPLAIN " + statement, params).fetchall()
            else:
                names: list[str] = []

                def numbered(match: re.Match[str]) -> str:
                    if match.group(1) not in names:
                        names.append(match.group(1))
                    return f"${names.index(match.group(1)) + 1}"

                cur.execute("PREPARE planned AS " + re.sub(r"%\((\w+)\)s", numbered, statement))
                cur.execute("SET plan_cache_mode = force_generic_plan")
                values = psql.SQL(", ").join(psql.Literal(params[n]) for n in names)
                query = psql.SQL("EXPLAIN EXECUTE planned({})").format(values)
                plan = cur.execute(query).fetchall()
                cur.execute("DEALLOCATE planned")
                cur.execute("RESET plan_cache_mode")
        raw.rollback()
    return {m.group(1) for (line,) in plan if (m := _SCANNED.search(line))}


def test_statements_over_many_messages_read_only_their_days(outbox: Engine, stub: Any) -> None:
    """Messages on two past days among six days of messages: every statement over several of
    them that the worker's batch, the relay's claim, a lease renewal and a batch of receipts
    run scans only those two days' tables (and the day between them in a generic plan),
    never the others."""
    engine = outbox
    now = dt.datetime.now(dt.UTC)
    for ago in range(6):  # every day holds messages
        for n in range(3):
            _add(engine, f"other-{ago}-{n}", "sent", now - dt.timedelta(days=ago))
    pairs = [
        (
            _add(engine, f"batch-{ago}-{n}", "dispatched", now - dt.timedelta(days=ago)),
            f"batch-{ago}-{n}",
        )
        for ago in (4, 2)
        for n in range(3)
    ]
    due = [
        _add(engine, f"due-{ago}-{n}", "pending", now - dt.timedelta(days=ago))
        for ago in (4, 2)
        for n in range(3)
    ]
    today = now.date()
    # Planned for its ids, a statement reads their days; a generic plan prunes to the range
    # from their lowest to their highest, so the day between them too.
    days = {
        generic: {
            f"{table}_p{today - dt.timedelta(days=ago):%Y%m%d}"
            for ago in ((4, 3, 2) if generic else (4, 2))
            for table in ("delivery_messages", "delivery_attempts", "delivery_receipts")
        }
        for generic in (False, True)
    }
    seen: list[tuple[str, dict[str, Any]]] = []
    settings = dataclasses.replace(
        get_settings(), database_url=engine.url.render_as_string(hide_password=False)
    )
    service = Service.from_settings(settings)

    def capture(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        ids = [v for v in (params or {}).values() if isinstance(v, int) and v >> 32]
        arrays = [
            v
            for v in (params or {}).values()
            if isinstance(v, list) and v and isinstance(v[0], int)
        ]
        if (len(ids) > 1 or arrays) and "delivery_" in statement:
            seen.append((statement, dict(params)))

    event.listen(service.engine, "before_cursor_execute", capture)
    try:
        results = deliver_many(service, pairs)
        assert [r.action for r in results] == [Action.DONE] * len(pairs)
        with service.engine.begin() as conn:
            assert sorted(c.id for c in claim(conn, limit=100, lease=60)) == sorted(due)
        with tell_outcomes_after(), service.engine.begin() as conn:
            renew_held(conn, [i for i, _ in pairs], hold_lease=30, send_lease=60)
            receipts = [ReceiptEvent("stub", f"r-{key}", key, "delivered") for _, key in pairs]
            record_many(conn, receipts)
    finally:
        event.remove(service.engine, "before_cursor_execute", capture)
        service.close()
    kinds = {re.sub(r"\s+", " ", s)[:40] for s, _ in seen}
    # the worker's read, take and finish, the claim's UPDATE, two renewals, the receipts' moves
    assert len(seen) >= 7, kinds
    for statement, params in seen:
        for generic in (False, True):
            scanned = _scanned(engine, statement, params, generic)
            assert scanned and scanned <= days[generic], (generic, scanned, statement)
