"""Held-message leases and relay back-pressure (issue 12 §2).

``renew_held`` and ``renew_queued`` on real PostgreSQL (their fences, the cap at
``send_lease``, which rows count as still queued), the relay's per-priority rooms, and
``Backpressure``'s arithmetic. Like ``tests/test_relay.py``, every row
is due an hour from now and the functions run with ``now`` two hours ahead, so a live relay
or sweeper of the suite never touches them.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Sequence

import pytest
from sqlalchemy import Engine, insert, select

from delivery.core.models import messages_table, utcnow
from delivery.relay.backpressure import SHARE, Backpressure
from delivery.relay.claims import Claim, relay_once
from delivery.relay.sweeper import sweep
from delivery.sending.leases import Renewed, renew_held, renew_queued
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
def test_queued_rows_renewed_by_the_relay_outlive_their_first_lease(clean: Engine) -> None:
    """With 2 tasks in the normal queue, the 2 newest dispatched normal rows (claimed last,
    so still queued) get ``now + lease`` and outlive their first lease; an older one (taken by
    a worker), a short retry, a row of another priority or status, and a longer lease are left
    alone. A queue of unknown depth renews nothing."""
    now = utcnow() + 2 * LATER
    soon = now + dt.timedelta(seconds=2)

    def claimed(seconds: float, priority: str = "normal") -> dict[str, object]:
        at = now - dt.timedelta(seconds=seconds)
        return dict(
            status="dispatched",
            updated_at=at,
            next_attempt_at=at,
            lease_expires_at=soon,
            priority=priority,
            attempts=0,
        )

    ids = _rows(
        clean,
        [
            claimed(30),  # taken by a worker: older than the queued ones
            claimed(3),  # queued
            claimed(1),  # queued
            claimed(1, "bulk"),
            {  # a short retry, parked 1 s ago, due in 5 s
                **claimed(1),
                "next_attempt_at": now + dt.timedelta(seconds=5),
            },
            {**claimed(0), "status": "sending", "attempts": 1},
        ],
    )
    with clean.begin() as conn:
        assert renew_queued(conn, {"normal": 2, "bulk": None}, lease=10, now=now) == 2
    until = now + dt.timedelta(seconds=10)
    assert _leases(clean, ids) == [soon, until, until, soon, soon, soon]
    # A lease renewed less than lease / 3 ago is not rewritten by the next pass; an older one is.
    with clean.begin() as conn:
        assert renew_queued(conn, {"normal": 2}, lease=10, now=now + _s(3)) == 0
        assert renew_queued(conn, {"normal": 2}, lease=10, now=now + _s(4)) == 2
    now += _s(4)
    until = now + _s(10)
    assert _leases(clean, ids) == [soon, until, until, soon, soon, soon]
    swept = sweep(clean, now=now + _s(5))
    assert (swept.requeued, swept.recovered) == (3, 1)  # all but the queued two; the send
    assert sweep(clean, now=now + _s(11)).requeued == 2


def _s(seconds: float) -> dt.timedelta:
    return dt.timedelta(seconds=seconds)


def test_keeper_renews_a_received_message_at_once_without_polling() -> None:
    """The keeper renews a message the moment the worker receives it (``task_received``), not
    at its next periodic pass (an hour away here); a failed renewal is tried again with the
    next wake-up."""
    from delivery.worker.leases import Keeper

    renewed: list[set[int]] = []
    failed, called = threading.Event(), threading.Event()

    def renew(ids: set[int]) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("database down")
        renewed.append(set(ids))
        called.set()

    keeper = Keeper(3600.0, renew)
    keeper.start()
    try:
        keeper.received(7)  # this renewal fails...
        assert failed.wait(30.0)
        keeper.received(8)  # ...and the next wake-up renews both
        assert called.wait(30.0)
        assert renewed == [{7, 8}]
    finally:
        keeper.stop()
    assert not keeper.is_alive()


@pytest.mark.integration
def test_relay_knows_the_depth_of_every_queue_empty_ones_included(clean: Engine) -> None:
    """The relay's broker depths are numbers for every queue, an empty Redis queue included
    (no key in Redis: a passive declare called it missing, so the relay published a whole
    backlog at once, without back-pressure or renewal, just when it fell due)."""
    from delivery.worker.schedule import queue_depths

    depths = queue_depths()
    assert set(depths) == {"urgent", "normal", "bulk"}
    assert all(isinstance(depth, int) and depth >= 0 for depth in depths.values()), depths
