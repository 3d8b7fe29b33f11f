"""Message states and the transitions between them.

::

    (new) ──enqueue, due now, nudge installed──▶ dispatched   (published after the commit)
    (new) ──enqueue──▶ pending
    pending ──relay──▶ dispatched ──worker──▶ sending ──▶ sent
       ▲  │                 │                    │ ├────▶ dead      (permanent, or attempts spent)
       │  └─cancel─▶ cancelled                   │ ├────▶ unknown   (policy give_up)
       │                    │                    │ └────▶ dispatched (retry soon, Celery countdown)
       └──── lease expired ─┘                    └──────▶ pending    (retry later,
                                                                      lease expired: unknown policy)
    dispatched ──breaker open──▶ pending (no attempt spent)
    pending, dispatched ──ttl passed──▶ expired
    dead, unknown ──redrive──▶ pending   (same key; attempts go on, a fresh budget)
    dispatched ──recipient on the suppression list──▶ suppressed   (never sent)
    sent, unknown ──receipt──▶ delivered | undelivered   (the provider's callback)
    undelivered ──receipt──▶ delivered   (delivered proves arrival; never the other way)

- ``pending``: waits for ``next_attempt_at``; the relay claims it.
- ``dispatched``: a task was published (or, for a row ``enqueue`` wrote claimed while the
  post-commit nudge is installed, is published right after the caller's commit);
  ``lease_expires_at`` bounds how long the row waits for it, so a publish lost with its
  process comes back to ``pending`` ``dispatch_lease`` after the ``enqueue``. A short retry
  also parks the row here with ``next_attempt_at`` in the future.
- ``sending``: a worker committed that it is calling the provider; the unknown window.
- ``sent``: the provider accepted it (``provider_ref`` holds its id).
- ``dead``: permanent error, or attempts exhausted; ops can redrive it.
- ``unknown``: the provider may or may not have it; needs review (``resolve``/``redrive``).
- ``cancelled``: cancelled while pending.
- ``expired``: its time-to-live (``expires_at``) passed before it could be sent; never sent
  late (an OTP is worthless after five minutes).
- ``delivered``: the provider's receipt says it reached the recipient.
- ``undelivered``: the provider's receipt says it accepted it but could not deliver it.
- ``suppressed``: its recipient is on the channel's suppression list (a receipt said they
  unsubscribed or cannot be reached); it was never sent.

Receipts only move a message up ``sent`` < ``undelivered`` < ``delivered`` (``RECEIPT_RANK``),
so the order they arrive in never changes where it ends: a late ``sent`` after ``delivered``,
or a duplicate, changes nothing. A final receipt for an ``unknown`` message proves the provider
had it, and resolves it.

Every transition is a conditional UPDATE on the expected status (and attempt count), so a
duplicate task, a second relay or a late worker changes nothing; each is a named function of
``delivery.transitions``, the one room that writes the status.
"""

from __future__ import annotations

import enum

__all__ = ["FINAL", "OPEN", "RECEIPT_RANK", "Status"]


class Status(enum.StrEnum):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    SENDING = "sending"
    SENT = "sent"
    DEAD = "dead"
    UNKNOWN = "unknown"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    DELIVERED = "delivered"
    UNDELIVERED = "undelivered"
    SUPPRESSED = "suppressed"


FINAL = frozenset(
    {
        Status.SENT,
        Status.DEAD,
        Status.UNKNOWN,
        Status.CANCELLED,
        Status.EXPIRED,
        Status.DELIVERED,
        Status.UNDELIVERED,
        Status.SUPPRESSED,
    }
)
#: Where receipts may take a message, lowest first: a receipt moves it only upwards.
RECEIPT_RANK: dict[Status, int] = {Status.SENT: 0, Status.UNDELIVERED: 1, Status.DELIVERED: 2}
OPEN = frozenset({Status.PENDING, Status.DISPATCHED, Status.SENDING})
