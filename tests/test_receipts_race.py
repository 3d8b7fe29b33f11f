"""Two receipts of one message at once, on PostgreSQL: the ``undelivered`` one moves it first
and holds the row; the ``delivered`` one waits on the row lock of its read, then reads where
the first left it and still moves it up to ``delivered``. The order of concurrent receipts
never decides where a message ends."""

from __future__ import annotations

import threading
import time

from sqlalchemy import Engine, select, text

from delivery.core.models import Message, Receipt, messages_table
from delivery.transitions.receipts import ReceiptEvent, record
from tests.factories import message_values
from tests.fence_kit import fence_db, fence_engine

__all__ = ["fence_db", "fence_engine"]  # fixtures, used by name


def waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )
        )


def test_a_delivered_receipt_that_waited_on_an_undelivered_one_still_wins(
    fence_db: Engine,
) -> None:
    """The delivered receipt waits behind the undelivered one's uncommitted move (it never
    plans from the ``sent`` it would have read without the lock); it plans from undelivered
    and the message ends delivered."""
    with fence_db.begin() as conn:
        conn.execute(messages_table.insert(), [message_values("race", "sent")])
    first = fence_db.connect()
    moving = first.begin()
    record(first, ReceiptEvent("stub", "evt-undelivered", "race", "undelivered", "X"))
    done: list[object] = []

    def second() -> None:
        with fence_db.begin() as conn:
            done.append(record(conn, ReceiptEvent("stub", "evt-delivered", "race", "delivered")))

    thread = threading.Thread(target=second)
    thread.start()
    deadline = time.monotonic() + 10
    while not waiting_on_a_lock(fence_db):  # the second waits on the row
        assert time.monotonic() < deadline, "the second receipt never waited on the row"
        time.sleep(0.01)
    moving.commit()
    first.close()
    thread.join(10)
    with fence_db.connect() as conn:
        status = conn.scalar(select(Message.status).where(Message.key == "race"))
        effects = dict(conn.execute(select(Receipt.event, Receipt.effect)).all())
    assert status == "delivered"
    assert effects == {"evt-undelivered": "moved", "evt-delivered": "moved"}
