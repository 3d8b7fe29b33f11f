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
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Engine, insert, select, update

from delivery.observability.events import Transition, emit
from delivery.pipeline.clock import db_now
from delivery.pipeline.models import attempts_table, messages_table
from delivery.pipeline.policies import UnknownPolicy
from delivery.pipeline.status import Status

__all__ = ["SweepReport", "sweep"]

LEASE_EXPIRED = "LEASE_EXPIRED"
_LOGGED = (
    messages_table.c.id,
    messages_table.c.key,
    messages_table.c.provider,
    messages_table.c.attempts,
)


@dataclass(frozen=True, slots=True)
class SweepReport:
    requeued: int
    recovered: int
    unknown: int
    expired: int = 0


def sweep(engine: Engine, *, limit: int = 1000, now: dt.datetime | None = None) -> SweepReport:
    """One pass; ``now`` (default: the database's clock, the one every lease was written on)
    decides which leases and time-to-lives have passed."""
    with engine.begin() as conn:
        now = now or db_now(conn)
        expired = {
            old: conn.execute(
                update(messages_table)
                .where(messages_table.c.status == old.value, messages_table.c.expires_at < now)
                .values(
                    status=Status.EXPIRED.value,
                    lease_expires_at=None,
                    updated_at=now,
                    last_error_code="EXPIRED",
                    last_error="time-to-live passed before it could be sent",
                )
                .returning(*_LOGGED)
            ).all()
            for old in (Status.PENDING, Status.DISPATCHED)
        }
        requeued = conn.execute(
            update(messages_table)
            .where(
                messages_table.c.status == Status.DISPATCHED.value,
                messages_table.c.lease_expires_at < now,
            )
            .values(status=Status.PENDING.value, lease_expires_at=None, updated_at=now)
            .returning(*_LOGGED)
        ).all()
        stuck = conn.execute(
            select(
                messages_table.c.id,
                messages_table.c.key,
                messages_table.c.provider,
                messages_table.c.attempts,
                messages_table.c.max_attempts,
                messages_table.c.on_unknown,
            )
            .where(
                messages_table.c.status == Status.SENDING.value,
                messages_table.c.lease_expires_at < now,
            )
            .limit(limit)
        ).all()
    recovered = unknown = 0
    for row in stuck:
        policy = UnknownPolicy(row.on_unknown)
        give_up = policy is UnknownPolicy.GIVE_UP or row.attempts >= row.max_attempts
        target = Status.UNKNOWN if give_up else Status.PENDING
        reason = "worker lost during the send (lease expired); outcome unknown"
        values: dict[str, object] = dict(
            status=target.value,
            lease_expires_at=None,
            updated_at=now,
            last_error_code=LEASE_EXPIRED,
            last_error=reason,
        )
        if not give_up:
            values.update(next_attempt_at=now, needs_lookup=policy is UnknownPolicy.LOOKUP)
        with engine.begin() as conn:
            done = conn.execute(
                update(messages_table)
                .where(
                    messages_table.c.id == row.id,
                    messages_table.c.status == Status.SENDING.value,
                    messages_table.c.attempts == row.attempts,
                    messages_table.c.lease_expires_at < now,
                )
                .values(**values)
            ).rowcount
            if not done:
                continue
            conn.execute(
                insert(attempts_table).values(
                    message_id=row.id,
                    number=row.attempts,
                    kind="send",
                    started_at=now,
                    outcome="unknown",
                    error_code=LEASE_EXPIRED,
                    error=reason,
                )
            )
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
    for row in requeued:
        emit(
            Transition(
                row.id,
                row.key,
                row.provider,
                Status.DISPATCHED,
                Status.PENDING,
                row.attempts,
                "lease_expired",
            )
        )
    for old, rows in expired.items():
        for row in rows:
            emit(
                Transition(
                    row.id,
                    row.key,
                    row.provider,
                    old,
                    Status.EXPIRED,
                    row.attempts,
                    "expired",
                    "EXPIRED",
                )
            )
    return SweepReport(
        len(requeued), recovered, unknown, sum(len(rows) for rows in expired.values())
    )
