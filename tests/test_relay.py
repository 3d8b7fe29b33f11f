"""The relay's claim on real PostgreSQL: concurrency, leases, and the sweeper.

A session-wide pipeline (worker, beat) may be running while these tests do: every row here is
due an hour from now and the functions are called with ``now`` two hours ahead, so the live
relay and sweeper never touch them.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from collections.abc import Sequence

import pytest
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.orm import Session

from delivery.core.models import Message, messages_table, utcnow
from delivery.relay.claims import Claim, relay_once
from delivery.relay.sweeper import sweep
from tests.factories import message_values

pytestmark = pytest.mark.integration


LATER = dt.timedelta(hours=1)


def future() -> dt.datetime:
    """The clock the tests run the relay and sweeper at."""
    return utcnow() + 2 * LATER


def add_due(engine: Engine, n: int, **overrides: object) -> None:
    now = utcnow() + LATER
    times = dict(next_attempt_at=now, created_at=now, updated_at=now, max_attempts=3)
    rows = [message_values(f"due-{i}", **times, **overrides) for i in range(n)]
    with engine.begin() as conn:
        conn.execute(insert(messages_table), rows)


def test_two_relays_publish_each_row_once(clean: Engine) -> None:
    """Two relays racing over 1,000 due rows publish every row exactly once."""
    add_due(clean, 1000)
    published: list[Claim] = []
    lock = threading.Lock()
    start = threading.Barrier(2)

    def publish(claims: Sequence[Claim]) -> None:
        with lock:
            published.extend(claims)

    def run() -> None:
        start.wait()
        relay_once(clean, publish, batch=50, lease=30, now=future())

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_row = Counter(c.id for c in published)
    assert len(per_row) == 1000 and set(per_row.values()) == {1}
    with clean.connect() as conn:
        statuses = set(conn.scalars(select(messages_table.c.status)))
    assert statuses == {"dispatched"}


def test_failed_publish_returns_rows_to_pending(clean: Engine) -> None:
    """When publishing fails, the claimed rows go back to pending for the next tick."""
    add_due(clean, 10)

    def broken(claims: Sequence[Claim]) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        relay_once(clean, broken, batch=100, lease=30, now=future())
    with clean.connect() as conn:
        assert set(conn.scalars(select(messages_table.c.status))) == {"pending"}


def test_future_rows_are_not_claimed(clean: Engine) -> None:
    """A row scheduled in the future stays pending until it is due."""
    add_due(clean, 3)
    with clean.begin() as conn:
        conn.execute(
            update(messages_table)
            .where(messages_table.c.key == "due-0")
            .values(next_attempt_at=utcnow() + 3 * LATER)
        )
    claimed: list[Claim] = []
    relay_once(clean, claimed.extend, batch=10, lease=30, now=future())
    assert sorted(c.key for c in claimed) == ["due-1", "due-2"]


def test_sweeper_recovers_expired_leases_by_policy(clean: Engine) -> None:
    """Expired dispatched rows return to pending; expired sending rows follow their policy."""
    past = utcnow() + LATER  # expired at future(), not yet for the live sweeper
    add_due(clean, 5)
    with clean.begin() as conn:

        def set_row(key: str, **values: object) -> None:
            conn.execute(
                update(messages_table)
                .where(messages_table.c.key == key)
                .values(lease_expires_at=past, **values)
            )

        set_row("due-0", status="dispatched")
        set_row("due-1", status="sending", attempts=1, on_unknown="retry")
        set_row("due-2", status="sending", attempts=1, on_unknown="lookup")
        set_row("due-3", status="sending", attempts=1, on_unknown="give_up")
        set_row("due-4", status="sending", attempts=3, on_unknown="retry")
    report = sweep(clean, now=future())
    assert (report.requeued, report.recovered, report.unknown) == (1, 2, 2)
    with clean.connect() as conn:
        rows = {
            r.key: (r.status, r.needs_lookup)
            for r in conn.execute(select(Message.key, Message.status, Message.needs_lookup))
        }
    assert rows == {
        "due-0": ("pending", False),
        "due-1": ("pending", False),
        "due-2": ("pending", True),
        "due-3": ("unknown", False),
        "due-4": ("unknown", False),
    }


def test_relay_and_sweeper_log_their_transitions(clean: Engine) -> None:
    """Every row the relay claims, and every lease the sweeper ends, is one transition event."""
    from delivery.observability.events import Transition, add_hook, remove_hook

    seen: list[Transition] = []
    add_hook(seen.append)
    try:
        add_due(clean, 3)
        relay_once(clean, lambda claims: None, batch=10, lease=30, now=future())
        sweep(clean, now=future() + dt.timedelta(seconds=60))
    finally:
        remove_hook(seen.append)
    moves = sorted((t.key, t.from_status, t.to_status) for t in seen)
    assert moves == sorted(
        [(f"due-{i}", "pending", "dispatched") for i in range(3)]
        + [(f"due-{i}", "dispatched", "pending") for i in range(3)]
    )
    assert {t.provider for t in seen} == {"stub"}


def test_a_nudged_row_whose_publish_never_happened_is_sent_after_its_lease(
    live: Engine,
    stub,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row enqueued with the nudge installed is committed already claimed; if the process
    dies between its commit and the publish (here the publish is left out), no task exists:
    the sweeper gives the row back when its lease (dispatch_lease, the default) passes and
    the relay publishes it. Sent once, and not before the lease."""
    import delivery
    from delivery.outbox import enqueue as outbox
    from tests.conftest import counts, drained, wait_until

    handed: list[Claim] = []
    monkeypatch.setattr(outbox, "_nudge", handed.extend)  # the publish that never happens
    lease = delivery.get_settings().dispatch_lease
    with Session(live) as session, session.begin():
        delivery.enqueue(
            session, channel="sms", to="+12015550123", payload={"body": "x"}, key="lost-publish"
        )
    committed = time.monotonic()
    assert [c.key for c in handed] == ["lost-publish"]
    assert counts(live) == {"dispatched": 1}  # the relay leaves a claimed row alone
    wait_until(lambda: stub.effects().get("lost-publish") == 1, timeout=lease + 30, every=0.1)
    assert time.monotonic() - committed >= lease - 1.0
    assert drained(live, 1, timeout=30) == {"sent": 1}
    assert stub.effects() == {"lost-publish": 1}
