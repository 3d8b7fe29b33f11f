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

Every change goes through the conditional UPDATEs of ``delivery.pipeline.lifeline``
(``move_all`` for a batch, ``move_lost`` for one send): the expected status (and, for a send, the
attempt count) is the fence, so a row a worker settles meanwhile is never moved.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Engine, select

from delivery.observability.events import Transition, emit
from delivery.pipeline.clock import db_now
from delivery.pipeline.lifeline import LEASE_EXPIRED, log_lost, move_all, move_lost
from delivery.pipeline.models import messages_table
from delivery.pipeline.policies import UnknownPolicy
from delivery.pipeline.status import Status

__all__ = ["LEASE_EXPIRED", "SweepReport", "sweep"]

_LOST = "worker lost during the send (lease expired); outcome unknown"


@dataclass(frozen=True, slots=True)
class SweepReport:
    requeued: int
    recovered: int
    unknown: int
    expired: int = 0


def sweep(engine: Engine, *, limit: int = 1000, now: dt.datetime | None = None) -> SweepReport:
    """One pass; ``now`` (default: the database's clock, the one every lease was written on)
    decides which leases and time-to-lives have passed."""
    m = messages_table.c
    with engine.begin() as conn:
        now = now or db_now(conn)
        expired = {
            old: move_all(
                conn,
                old,
                Status.EXPIRED,
                m.expires_at < now,
                lease_expires_at=None,
                updated_at=now,
                last_error_code="EXPIRED",
                last_error="time-to-live passed before it could be sent",
            )
            for old in (Status.PENDING, Status.DISPATCHED)
        }
        requeued = move_all(
            conn,
            Status.DISPATCHED,
            Status.PENDING,
            m.lease_expires_at < now,
            lease_expires_at=None,
            updated_at=now,
        )
        stuck = conn.execute(
            select(m.id, m.key, m.provider, m.attempts, m.max_attempts, m.on_unknown)
            .where(m.status == Status.SENDING.value, m.lease_expires_at < now)
            .limit(limit)
        ).all()
    recovered = unknown = 0
    for row in stuck:
        policy = UnknownPolicy(row.on_unknown)
        give_up = policy is UnknownPolicy.GIVE_UP or row.attempts >= row.max_attempts
        target = Status.UNKNOWN if give_up else Status.PENDING
        values: dict[str, object] = dict(
            lease_expires_at=None,
            updated_at=now,
            last_error_code=LEASE_EXPIRED,
            last_error=_LOST,
        )
        if not give_up:
            values.update(next_attempt_at=now, needs_lookup=policy is UnknownPolicy.LOOKUP)
        with engine.begin() as conn:
            if not move_lost(conn, row.id, row.attempts, target, now=now, values=values):
                continue
            log_lost(conn, row.id, row.attempts, now, _LOST)
        emit(
            Transition(
                row.id,
                row.key,
                row.provider,
                Status.SENDING,
                target,
                row.attempts,
                "unknown",
                LEASE_EXPIRED,
            )
        )
        if give_up:
            unknown += 1
        else:
            recovered += 1
    for back in requeued:
        emit(
            Transition(
                back.id,
                back.key,
                back.provider,
                Status.DISPATCHED,
                Status.PENDING,
                back.attempts,
                "lease_expired",
            )
        )
    for old, rows in expired.items():
        for gone in rows:
            emit(
                Transition(
                    gone.id,
                    gone.key,
                    gone.provider,
                    old,
                    Status.EXPIRED,
                    gone.attempts,
                    "expired",
                    "EXPIRED",
                )
            )
    return SweepReport(
        len(requeued), recovered, unknown, sum(len(rows) for rows in expired.values())
    )
