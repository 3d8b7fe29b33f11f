"""``delivery.deliver``: one attempt for one message (its publisher: ``delivery.worker.publish``).

What each outcome looks like in Flower (events; the outbox row stays the record):

- ``SUCCESS``, result ``sent via PROVIDER``: that provider accepted it.
- ``RETRY`` with an ETA: a short retry (Celery countdown, at most ``max_countdown``).
- ``PARKED`` (a custom state, sent as a ``task-parked`` event), result ``parked: CODE until
  TIME ...``: back in the outbox as ``pending`` (open breaker, long backoff, Retry-After); the
  relay publishes it again when due, under the same task id. ``failed over to PROVIDER ...``:
  pending again, due now, for the next provider of its route.
- ``FAILURE`` with ``DeadLettered``: it ended ``dead``, ``unknown`` or ``expired``; its result
  field (set by a ``task-dead-lettered`` event) names the status, error code and provider
  (``dead: 21211 via twilio``), so Flower's search finds ``21211`` or ``result:dead``.
- ``SUCCESS``, result ``skipped: ...``: a duplicate or late task that had nothing to do.

``retries`` counts the provider attempts the message had before this task ran, across
republishes (the relay publishes with the row's attempt count).
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from pathlib import Path

from celery import Task
from celery.exceptions import Ignore

from delivery.core.status import Status
from delivery.errors import ConfigError
from delivery.runtime.current import get_settings
from delivery.sending.sender import Action, Result
from delivery.sending.sender import deliver as deliver_once
from delivery.transitions.failover import FAILOVER
from delivery.worker.app import app, service

__all__ = ["BATCH", "DeadLettered", "announce", "deliver", "outcome_text", "parked_text"]


class DeadLettered(Exception):
    """Raised by the task when its message ends ``dead`` or ``unknown`` so that Flower shows it
    as a failed task. It names the error code, the message id and key, never the provider's
    text; the outbox row holds the full story (``delivery show KEY``)."""


log = logging.getLogger("delivery.tasks")

DELIVER = "delivery.deliver"
BATCH = "delivery.deliver_batch"

_NOT_DELIVERED = {
    "dead": "in the dead-letter status (dead)",
    "unknown": "parked as unknown for review (it may have been delivered)",
    "expired": "expired: its time-to-live passed before it could be sent (never sent)",
}


def parked_text(result: Result) -> str:
    """The ``task-parked`` event's result for a message parked until ``result.delay`` s from
    now, or moved to the next provider of its route (``FAILOVER``)."""
    if result.code == FAILOVER:
        return (
            f"failed over to {result.provider}; back in the outbox as pending, due now; the "
            "relay publishes it again for that provider"
        )
    due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=result.delay or 0.0)
    return (
        f"parked: {result.code} until {due.isoformat(timespec='seconds')}; back in the "
        "outbox as pending, no attempt spent; the relay publishes it again then"
    )


def outcome_text(result: Result) -> str:
    """A final result as Flower shows it: ``sent via PROVIDER``, ``dead: CODE via PROVIDER``
    (the provider it went through or ended at; the code alone when there is none)."""
    via = f" via {result.provider}" if result.provider else ""
    if result.status == Status.SENT:
        return f"sent{via}"
    return f"{result.status}: {result.code}{via}" if result.code else f"{result.status}{via}"


def dead_lettered(result: Result, message_id: int, key: str) -> DeadLettered:
    """The error of a message that ended ``result.status`` (one of ``_NOT_DELIVERED``)."""
    # The code, the id and the key only: this text reaches the worker log, the broker's
    # task-failed event and Flower, so never the provider's reason (G6).
    return DeadLettered(
        f"{result.code}: message {message_id} is {_NOT_DELIVERED[str(result.status)]}; "
        f"delivery show {key!r}, delivery redrive to send it again"
    )


def announce(task: Task, event: str, result: str) -> None:
    """A custom task event for Flower: its state becomes ``event`` upper-cased and its
    ``result`` field (searchable) ``result``. Events are a view: a failure to send one is
    logged, never a reason to fail a delivery."""
    if not task.app.conf.worker_send_task_events:
        return
    try:
        task.send_event(f"task-{event}", result=result)
    except Exception as exc:
        log.warning("could not send the %s event of task %s: %r", event, task.request.id, exc)


@app.task(name=DELIVER, bind=True, max_retries=None, throws=(DeadLettered,))  # type: ignore[untyped-decorator]
def deliver(self: Task, message_id: int, key: str) -> str:
    """Carries only the message id and key (no recipient, no body): guarantee G6."""
    result = deliver_once(service(), message_id, key)
    if result.action is Action.RETRY and result.delay is not None:
        raise self.retry(countdown=result.delay, max_retries=None)
    if result.action is Action.PARKED:
        announce(self, "parked", parked_text(result))
        raise Ignore()  # acknowledged; no success event, so Flower keeps PARKED
    if result.action is Action.DONE and result.status in _NOT_DELIVERED:
        announce(self, "dead-lettered", outcome_text(result))
        raise dead_lettered(result, message_id, key)
    if result.action is Action.SKIP:
        return f"skipped: {result.reason}"
    return outcome_text(result) if result.status else result.action.value


# Read the settings now, at start-up: a half-configured process (a database URL but no broker,
# say) fails here with a ConfigError naming the missing variable, not at its first commit,
# whose nudge would only log it. Worker and beat import this module too.
def _check_settings() -> None:
    try:
        get_settings()
    except ConfigError as exc:
        if Path(sys.argv[0]).name in ("celery", "__main__.py") and "celery" in sys.argv[0]:
            raise SystemExit(f"delivery: {exc}") from None  # the celery command: one line
        raise


_check_settings()
