"""A message's move to the next provider of its route (``fail_over``), once
``delivery.guards.failover`` decided that no attempt on its provider can have taken effect.
Fenced like every worker move (status and attempt count).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, Row

from delivery.core.status import Status
from delivery.observability.events import Transition, emit
from delivery.transitions.fence import move_where
from delivery.transitions.vocabulary import Sending

__all__ = ["FAILOVER", "fail_over"]

FAILOVER = "FAILOVER"
"""The code a message keeps once it moved to the next provider of its route."""


def fail_over(
    conn: Connection,
    entry: Row[Any] | Sending,
    to_provider: str,
    reason: tuple[str, str],
    due: dt.datetime,
    *,
    spent: bool,
) -> bool:
    """The message moves to ``to_provider`` (``delivery.guards.failover`` decided that no
    attempt on its provider can have taken effect): back to ``pending``, due at ``due``,
    not ``pinned``, no lookup needed (the new provider never had it); ``reason``: the
    failover's reason and its text. ``entry``: a ``dispatched`` row its worker never took, or
    a ``sending`` message (``Sending``) whose call failed (``spent``: its attempt counts) or
    was never made (taken ahead: the attempt is given back, as ``give_back`` does). Its
    ``Transition`` names ``to_provider`` and the reason as its ``code``; its outcome is the
    failed call's (``retryable``), or None when no call was made. Fenced on the status and
    attempt count seen; False if someone else moved it."""
    values: dict[str, object] = dict(
        provider=to_provider,
        pinned=False,
        needs_lookup=False,
        next_attempt_at=due,
        lease_expires_at=None,
        last_error_code=FAILOVER,
        last_error=reason[1],
    )
    if isinstance(entry, Sending):
        if not spent:
            values["max_attempts"] = entry.max_attempts + 1
        fence = (entry.id, entry.attempt, Status.SENDING)
    else:
        fence = (entry.id, entry.attempts, Status.DISPATCHED)
    if not move_where(conn, fence, Status.PENDING, None, values):
        return False
    emit(
        Transition(
            entry.id,
            entry.key,
            entry.provider,
            fence[2],
            Status.PENDING,
            fence[1],
            "retryable" if spent and isinstance(entry, Sending) else None,  # the call, if made
            reason[0],
            message_type=entry.message_type,
            to_provider=to_provider,
            channel=entry.channel,
            traceparent=getattr(entry, "traceparent", None),  # a row's; a Sending's span is open
        )
    )
    return True
