"""Held-message leases and relay back-pressure (issue 12 §2).

``renew_held`` and ``renew_waiting`` on real PostgreSQL (their fences, the cap at
``send_lease``), the relay's per-priority rooms, ``Backpressure``'s arithmetic and
``Waiting``'s bookkeeping of the tasks still queued. Like ``tests/test_relay.py``, every row
is due an hour from now and the functions run with ``now`` two hours ahead, so a live relay
or sweeper of the suite never touches them.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence

import pytest
from sqlalchemy import Engine, insert, select

from delivery.pipeline.backpressure import SHARE, Backpressure
from delivery.pipeline.leases import Renewed, renew_held, renew_waiting
from delivery.pipeline.models import messages_table, utcnow
from delivery.pipeline.relay import Claim, relay_once
from delivery.pipeline.sweeper import sweep
from delivery.pipeline.waiting import Waiting
from tests.factories import message_values

LATER = dt.timedelta(hours=1)


def _rows(engine: Engine, specs: Sequence[dict[str, object]]) -> list[int]:
    base = utcnow() + LATER
    rows = [
        message_values(
            f"lease-{i}",
            **{
                "next_attempt_at": base,
                "created_at": base,
                "updated_at": base,
                "max_attempts": 3,
                **spec,
            },
        )
        for i, spec in enumerate(specs)
    ]
    with engine.begin() as conn:
        return list(
            conn.execute(insert(messages_table).returning(messages_table.c.id), rows).scalars()
        )


def _leases(engine: Engine, ids: Sequence[int]) -> list[dt.datetime | None]:
    m = messages_table.c
    with engine.connect() as conn:
        found = dict(conn.execute(select(m.id, m.lease_expires_at).where(m.id.in_(ids))).all())
    return [found[i] for i in ids]


@pytest.mark.integration
def test_renewal_extends_held_rows_and_nothing_else(clean: Engine) -> None:
    """Held dispatched and sending rows get ``now + hold_lease``; a settled, pending or
    not-yet-due row, or a send older than ``send_lease - hold_lease``, keeps its lease."""
    now = utcnow() + 2 * LATER
    old = now - dt.timedelta(seconds=5)
    ids = _rows(
        clean,
        [
            dict(status="dispatched", lease_expires_at=old),
            dict(status="sending", attempts=1, lease_expires_at=old, updated_at=now),
            dict(status="sent", attempts=1, lease_expires_at=None),
            dict(status="pending", lease_expires_at=None),
            dict(status="dispatched", lease_expires_at=old, next_attempt_at=now + LATER),
            dict(
                status="sending",
                attempts=1,
                lease_expires_at=old,
                updated_at=now - dt.timedelta(seconds=55),
            ),
        ],
    )
    with clean.begin() as conn:
        done = renew_held(conn, ids, hold_lease=10, send_lease=60, now=now)
    assert done == Renewed(dispatched=1, sending=1)
    until = now + dt.timedelta(seconds=10)
    assert _leases(clean, ids) == [until, until, None, None, old, old]


@pytest.mark.integration
def test_unrenewed_rows_come_back_after_hold_lease(clean: Engine) -> None:
    """A row renewed at t is left alone by the sweeper before t + hold_lease and recovered
    after it: a dead worker's messages return in hold_lease, not dispatch_lease."""
    now = utcnow() + 2 * LATER
    ids = _rows(clean, [dict(status="dispatched", lease_expires_at=now + dt.timedelta(hours=1))])
    with clean.begin() as conn:
        renew_held(conn, ids, hold_lease=10, send_lease=60, now=now)
    assert sweep(clean, now=now + dt.timedelta(seconds=9)).requeued == 0
    assert sweep(clean, now=now + dt.timedelta(seconds=11)).requeued == 1


@pytest.mark.integration
def test_relay_publishes_no_more_than_each_priority_has_room_for(clean: Engine) -> None:
    """With rooms {urgent: 3, normal: 0, bulk: None}, a pass publishes 3 urgent, no normal and
    every bulk row; the rest stays pending for a later pass."""
    specs = [dict(priority=p) for p in ("urgent",) * 10 + ("normal",) * 10 + ("bulk",) * 10]
    _rows(clean, specs)
    published: list[Claim] = []
    relay_once(
        clean,
        published.extend,
        batch=4,
        lease=30,
        now=utcnow() + 2 * LATER,
        rooms={"urgent": 3, "normal": 0, "bulk": None},
    )
    assert Counter(c.priority for c in published) == {"urgent": 3, "bulk": 10}


def test_backpressure_limits_a_queue_to_half_a_lease_at_the_measured_rate() -> None:
    """A queue drained at 20 tasks/s may hold 20 * lease * SHARE tasks; one with no rate yet
    holds the floor; a queue whose depth is unknown is not limited."""
    pressure = Backpressure(lease=120.0, floor=100)
    assert pressure.rooms({"normal": 0, "bulk": None}, now=0.0) == {"normal": 100, "bulk": None}
    pressure.published("normal", 100)
    # one second later 20 were taken: 80 left in the queue
    rooms = pressure.rooms({"normal": 80}, now=1.0)
    assert pressure.limit("normal") == int(20 * 120.0 * SHARE)
    assert rooms == {"normal": int(20 * 120.0 * SHARE) - 80}


def test_backpressure_never_grants_room_to_a_full_queue() -> None:
    """Whatever the rate history, a queue holding more than its limit gets no room."""
    pressure = Backpressure(lease=10.0, floor=5)
    pressure.rooms({"normal": 0}, now=0.0)
    pressure.published("normal", 5)
    assert pressure.rooms({"normal": 5000}, now=1.0) == {"normal": 0}


@pytest.mark.integration
def test_waiting_rows_renewed_by_the_relay_outlive_their_first_lease(clean: Engine) -> None:
    """A dispatched row whose task still waits in the queue gets ``now + lease`` (never a
    shorter one), so the sweeper leaves it alone past its first lease; a row in another
    status is not touched (the fence)."""
    now = utcnow() + 2 * LATER
    soon, later = now + dt.timedelta(seconds=2), now + dt.timedelta(seconds=60)
    ids = _rows(
        clean,
        [
            dict(status="dispatched", lease_expires_at=soon),
            dict(status="dispatched", lease_expires_at=later),
            dict(status="sending", attempts=1, lease_expires_at=soon),
            dict(status="sent", attempts=1, lease_expires_at=None),
        ],
    )
    with clean.begin() as conn:
        assert renew_waiting(conn, ids, lease=10, now=now) == 1
    assert _leases(clean, ids) == [now + dt.timedelta(seconds=10), later, soon, None]
    assert sweep(clean, now=now + dt.timedelta(seconds=5)).requeued == 0
    assert sweep(clean, now=now + dt.timedelta(seconds=11)).requeued == 1


def test_waiting_keeps_the_newest_depth_ids_of_each_queue() -> None:
    """Queues are FIFO: with ``depth`` tasks left, the last ``depth`` published are waiting;
    a queue whose depth is unknown is forgotten, and one never published to has none."""
    waiting = Waiting()
    waiting.published("normal", [1, 2, 3, 4])
    waiting.published("bulk", [10, 11])
    assert sorted(waiting.observe({"normal": 4, "bulk": 2, "urgent": 0})) == [1, 2, 3, 4, 10, 11]
    assert sorted(waiting.observe({"normal": 1, "bulk": 5})) == [4, 10, 11]
    waiting.published("normal", [5])
    assert sorted(waiting.observe({"normal": 2, "bulk": None})) == [4, 5]
    assert waiting.observe({"normal": 0, "bulk": 3}) == []
