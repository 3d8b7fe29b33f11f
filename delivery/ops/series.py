"""Time series for the console's charts: what happened per time bucket over a window.

``series(session, window=3600, bucket=60)`` answers, per bucket (oldest first):

- ``sent``, ``dead``, ``unknown``: messages that reached that status, per minute (read from
  ``ix_delivery_messages_status``: status, updated_at);
- ``error_rate``: per provider, the share of send attempts that did not deliver (retryable,
  permanent or unknown), ``None`` for a bucket without attempts (``ix_delivery_attempts_
  started_at``);
- ``latency``: commit -> provider accept (``sent_at - created_at``) percentiles p50, p95,
  p99 in seconds, over at most ``latency_sample`` of the most recent sends.

Counting is done by the database (one GROUP BY per series), so a day of a busy outbox costs
a few hundred rows, not a row per message.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Integer, cast, func, select
from sqlalchemy.orm import Session

from delivery.core.models import Attempt, Message, utcnow
from delivery.core.status import Status

__all__ = ["ERROR_OUTCOMES", "Series", "percentile", "series"]

ERROR_OUTCOMES = ("retryable", "permanent", "unknown")
"""Attempt outcomes that count as errors in the provider error rate."""

_FINALS = (Status.SENT.value, Status.DEAD.value, Status.UNKNOWN.value)


@dataclass(frozen=True, slots=True)
class Series:
    """Per-bucket values, oldest bucket first; ``starts`` holds each bucket's start."""

    window: float
    bucket: float
    starts: list[dt.datetime]
    sent: list[float]
    dead: list[float]
    unknown: list[float]
    error_rate: dict[str, list[float | None]] = field(default_factory=dict)
    latency: dict[str, list[float | None]] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` (0-100) percentile of ``values`` by nearest rank; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _epoch(session: Session, column: Any) -> ColumnElement[Any]:
    if session.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", column)
    return cast(func.strftime("%s", column), Integer)


def _index(value: Any, start: float, bucket: float, count: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        seconds = moment.timestamp()
    else:
        seconds = float(value)
    slot = int((seconds - start) // bucket)
    return slot if 0 <= slot < count else None


def series(
    session: Session,
    *,
    window: float = 3600.0,
    bucket: float = 60.0,
    now: dt.datetime | None = None,
    latency_sample: int = 20000,
) -> Series:
    """The charts' series over the last ``window`` seconds in buckets of ``bucket`` seconds."""
    now = now or utcnow()
    count = max(1, math.ceil(window / bucket))
    end = math.floor(now.timestamp() / bucket) * bucket + bucket
    start = end - count * bucket
    since = dt.datetime.fromtimestamp(start, dt.UTC)
    starts = [dt.datetime.fromtimestamp(start + i * bucket, dt.UTC) for i in range(count)]
    per_minute = 60.0 / bucket
    totals = {status: [0.0] * count for status in _FINALS}
    slot_of = func.floor(_epoch(session, Message.updated_at) / bucket)
    rows = session.execute(
        select(Message.status, slot_of, func.count())
        .where(Message.status.in_(_FINALS), Message.updated_at >= since)
        .group_by(Message.status, slot_of)
    ).all()
    for status, slot, n in rows:
        index = _index(float(slot) * bucket, start, bucket, count)
        if index is not None:
            totals[str(status)][index] += int(n) * per_minute

    attempt_slot = func.floor(_epoch(session, Attempt.started_at) / bucket)
    failed = func.sum(func.cast(Attempt.outcome.in_(ERROR_OUTCOMES), Integer))
    rows = session.execute(
        select(Message.provider, attempt_slot, func.count(), failed)
        .join(Message, Message.id == Attempt.message_id)
        .where(Attempt.started_at >= since, Attempt.kind == "send")
        .group_by(Message.provider, attempt_slot)
    ).all()
    error_rate: dict[str, list[float | None]] = {}
    for provider, slot, n, bad in rows:
        index = _index(float(slot) * bucket, start, bucket, count)
        if index is not None and n:
            error_rate.setdefault(str(provider), [None] * count)[index] = int(bad or 0) / int(n)

    samples: list[list[float]] = [[] for _ in range(count)]
    recent = session.execute(
        select(Message.created_at, Message.sent_at)
        .where(Message.status == Status.SENT.value, Message.updated_at >= since)
        .order_by(Message.updated_at.desc())
        .limit(latency_sample)
    ).all()
    for created, sent in recent:
        index = _index(sent, start, bucket, count)
        if index is not None and created is not None and sent is not None:
            samples[index].append(max(0.0, (sent - created).total_seconds()))
    latency = {f"p{q}": [percentile(s, q) for s in samples] for q in (50, 95, 99)}
    return Series(
        window,
        bucket,
        starts,
        totals[Status.SENT.value],
        totals[Status.DEAD.value],
        totals[Status.UNKNOWN.value],
        dict(sorted(error_rate.items())),
        latency,
    )
