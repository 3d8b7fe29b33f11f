"""The worker's vocabulary: what a task does next (``Action``, ``Result``), the message in
flight (``Sending``) and why an attempt did not end it (``Failure``).
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

from delivery.config.settings import Backoff
from delivery.core.outcomes import Outcome, Retryable
from delivery.core.policies import UnknownPolicy
from delivery.core.status import Status

__all__ = ["IN_PROGRESS", "Action", "Failure", "Result", "Sending", "in_progress"]

IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS"
"""The code of a provider saying our own earlier attempt with this key is still running."""


class Action(enum.StrEnum):
    """What the task does after one attempt; the closed set ``Result.action`` takes."""

    DONE = "done"
    """A final state was reached (``Result.status`` says which)."""
    RETRY = "retry"
    """Re-run the task after ``Result.delay`` seconds; the row waits as ``dispatched``."""
    PARKED = "parked"
    """The row went back to the outbox as ``pending``; the relay publishes it when due."""
    SKIP = "skip"
    """Nothing to do: no such message, not ours, not due, or taken by another worker."""


@dataclass(frozen=True, slots=True)
class Result:
    """What the task should do next (``action``), and why."""

    action: Action
    status: str | None = None
    delay: float | None = None
    code: str | None = None
    reason: str | None = None
    provider: str | None = None
    """The provider that sent it, it ended at, or it failed over to (for Flower's result)."""


@dataclass(frozen=True, slots=True)
class Sending:
    """The message in flight: read once when the worker takes it, then passed along."""

    id: int
    key: str
    provider: str
    attempt: int
    max_attempts: int
    policy: UnknownPolicy
    backoff: Backoff
    enqueued_at: dt.datetime
    in_progress_wait: float | None = None
    """How long the provider may take on a key (its own budget), waited out on a 409."""
    message_type: str | None = None
    """Its type (``enqueue(type=...)``), for the app's ``Outcome``; None without one."""
    channel: str = ""
    pinned: bool = False
    """An earlier attempt on ``provider`` may have taken effect: it may not fail over."""


@dataclass(frozen=True, slots=True)
class Failure:
    """An attempt that did not deliver: its ``code`` and ``reason`` (stored on the row), the
    ``outcome`` kind for the transition log, the status the message ends in when it is not
    retried (``final``: permanent, given up, or attempts spent), the provider's
    ``retry_after`` wish, and whether the next attempt must look the key up first
    (``needs_lookup``; ``None`` leaves the flag as it is); ``pins``: the attempt may have
    taken effect (``outcomes.created_nothing`` is false), so the message is ``pinned`` to
    its provider from now on."""

    code: str
    reason: str
    outcome: str
    final: Status
    retry_after: float | None = None
    needs_lookup: bool | None = None
    pins: bool = True


def in_progress(outcome: Outcome) -> bool:
    """True when the provider answers that our own earlier attempt is still being processed:
    not a failure, and no attempt of ours to spend."""
    return isinstance(outcome, Retryable) and outcome.code == IN_PROGRESS
