"""The attempt rows (``delivery_attempts``): one per call to a provider, written with the
transition the call's outcome makes (``delivery.transitions.worker``), or by the
sweeper for a send whose worker was lost.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from sqlalchemy import BigInteger, Connection, DateTime, Float, Integer, String, Text, insert

from delivery.core.models import attempts_table, utcnow
from delivery.core.outcomes import LookupOutcome, Outcome
from delivery.transitions.vocabulary import Sending

__all__ = ["ATTEMPT_COLUMNS", "attempt_row", "log_attempt", "log_lost", "ms_since"]


def attempt_row(
    msg: Sending, kind: str, outcome: Outcome | LookupOutcome, latency: float
) -> dict[str, Any]:
    """The attempt row of one call that took ``latency`` ms and ended just now."""
    return dict(
        message_id=msg.id,
        number=msg.attempt,
        kind=kind,
        provider=msg.provider,
        outcome=outcome.kind,
        started_at=utcnow() - dt.timedelta(milliseconds=latency),
        http_status=outcome.http_status,
        latency_ms=round(latency, 3),
        error_code=getattr(outcome, "code", None),
        error=getattr(outcome, "reason", None),
    )


def ms_since(started: float) -> float:
    """Milliseconds since ``started`` (``time.perf_counter``)."""
    return (time.perf_counter() - started) * 1000.0


def log_attempt(
    conn: Connection, msg: Sending, kind: str, outcome: Outcome | LookupOutcome, started: float
) -> None:
    conn.execute(_INSERT_ATTEMPT, attempt_row(msg, kind, outcome, ms_since(started)))


#: One statement object for every attempt row (built per call, it cost SQLAlchemy's cache key
#: each time), inline: the row's new id is not asked back (``RETURNING``).
_INSERT_ATTEMPT = insert(attempts_table).inline()


def log_lost(conn: Connection, row: Any, now: dt.datetime, reason: str) -> None:
    """The attempt row of ``row``'s send (id, provider, attempts as read) whose worker was
    lost (its lease passed): outcome unknown."""
    conn.execute(
        _INSERT_ATTEMPT,
        dict(
            message_id=row.id,
            number=row.attempts,
            kind="send",
            provider=row.provider,
            started_at=now,
            outcome="unknown",
            http_status=None,
            latency_ms=None,
            error_code=LEASE_EXPIRED,
            error=reason,
        ),
    )


LEASE_EXPIRED = "LEASE_EXPIRED"
"""The code of an attempt whose worker was lost: its lease passed during the send."""

#: The attempt row's columns and their types, for the statements that write many at once.
ATTEMPT_COLUMNS: dict[str, Any] = {
    "message_id": BigInteger(),
    "number": Integer(),
    "kind": String(),
    "provider": String(),
    "outcome": String(),
    "started_at": DateTime(timezone=True),
    "http_status": Integer(),
    "latency_ms": Float(),
    "error_code": String(),
    "error": Text(),
}
