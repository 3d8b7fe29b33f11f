"""The sweeper: recover rows whose lease expired (Oban's "lifeline").

- ``dispatched`` past its lease: the task was lost (broker flushed, worker gone before it
  started). Back to ``pending``; the relay publishes it again. No attempt was spent.
- ``sending`` past its lease: the worker died during the call, so the provider may or may not
  have the message. This is the *unknown* outcome and goes through the message's policy:
  ``retry`` -> ``pending`` (the same key is sent again: a duplicate is possible only if the
  provider does not dedupe), ``lookup`` -> ``pending`` with a lookup before any new send,
  ``give_up`` -> ``unknown``. Spent attempts also end in ``unknown``.
- ``pending`` or ``dispatched`` past its time-to-live (``expires_at``): ``expired``, never sent
  late.
- A delivery receipt that arrived before its message's worker recorded it ``sent`` waits
  (``delivery.transitions.receipts``); each pass applies those whose message has moved on
  (the ``delivered`` or ``undelivered`` it makes is told to the app's outcome hooks once that
  transaction committed: ``tell_outcomes_after``).

Every change is a transition of ``delivery.transitions.recovery`` (``expire`` and
``requeue`` for every row that matches, ``recover`` for one send), which says why its fence
is safe and emits each ``Transition``: a row a worker settles meanwhile is never moved.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Engine, select

from delivery.core.clock import db_now
from delivery.core.models import messages_table
from delivery.core.policies import UnknownPolicy
from delivery.core.status import Status
from delivery.transitions import tell_outcomes_after
from delivery.transitions.receipts import apply_waiting
from delivery.transitions.recovery import LEASE_EXPIRED, expire, recover, requeue

__all__ = ["LEASE_EXPIRED", "SweepReport", "sweep"]

_LOST = "worker lost during the send (lease expired); outcome unknown"


@dataclass(frozen=True, slots=True)
class SweepReport:
    requeued: int
    recovered: int
    unknown: int
    expired: int = 0
    receipts: int = 0  # waiting receipts applied


def sweep(engine: Engine, *, limit: int = 1000, now: dt.datetime | None = None) -> SweepReport:
    """One pass; ``now`` (default: the database's clock, the one every lease was written on)
    decides which leases and time-to-lives have passed."""
    m = messages_table.c
    with engine.begin() as conn:
        now = now or db_now(conn)
        expired = sum(expire(conn, old, now) for old in (Status.PENDING, Status.DISPATCHED))
        requeued = requeue(conn, now)
        stuck = conn.execute(
            select(m.id, m.key, m.provider, m.attempts, m.max_attempts, m.on_unknown, m.traceparent)
            .where(m.status == Status.SENDING.value, m.lease_expires_at < now)
            .limit(limit)
        ).all()
    recovered = unknown = 0
    for row in stuck:
        policy = UnknownPolicy(row.on_unknown)
        give_up = policy is UnknownPolicy.GIVE_UP or row.attempts >= row.max_attempts
        values: dict[str, object] = dict(lease_expires_at=None, updated_at=now, last_error=_LOST)
        if not give_up:
            values.update(next_attempt_at=now, needs_lookup=policy is UnknownPolicy.LOOKUP)
        with tell_outcomes_after(), engine.begin() as conn:
            target = Status.UNKNOWN if give_up else Status.PENDING
            if not recover(conn, row, target, now, values):
                continue
        if give_up:
            unknown += 1
        else:
            recovered += 1
    with tell_outcomes_after(), engine.begin() as conn:
        receipts = apply_waiting(conn, limit)
    return SweepReport(requeued, recovered, unknown, expired, receipts)
