"""``delivery.deliver``: one attempt for one message, and the publisher the relay uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Task

from delivery import outbox
from delivery.relay import Claim, relay_once
from delivery.runtime import get_settings
from delivery.sender import deliver as deliver_once
from tasks.app import QUEUE, app, service

__all__ = ["DeadLettered", "deliver", "publish"]


class DeadLettered(Exception):
    """Raised by the task when its message ends ``dead`` or ``unknown`` so that Flower shows it
    as a failed task; the outbox row holds the full story (``delivery show KEY``)."""


@app.task(name="delivery.deliver", bind=True, max_retries=None, throws=(DeadLettered,))  # type: ignore[untyped-decorator]
def deliver(self: Task, message_id: int, key: str) -> str:
    """Carries only the message id and key (no recipient, no body): guarantee G6."""
    result = deliver_once(service(), message_id, key)
    if result.action == "retry" and result.delay is not None:
        raise self.retry(countdown=result.delay, max_retries=None)
    if result.action == "done" and result.status in ("dead", "unknown"):
        raise DeadLettered(
            f"{result.code}: {result.reason} -> message {message_id} is in the "
            f"{result.status} status (delivery show {key!r}; delivery redrive to retry)"
        )
    return result.status or result.action


def publish(claims: Sequence[Claim]) -> None:
    """Publish one deliver task per claimed row on one held producer connection.

    The task id is the message key, so Flower finds a message by its key."""
    with app.producer_or_acquire() as producer:
        for claim in claims:
            deliver.apply_async(
                (claim.id, claim.key), task_id=claim.key, producer=producer, queue=QUEUE
            )


def _nudge(engine: Any, ids: list[int]) -> None:
    settings = get_settings()
    relay_once(
        engine,
        publish,
        batch=max(len(ids), 1),
        lease=settings.dispatch_lease,
        ids=ids,
        max_batches=1,
    )


outbox.set_nudge(_nudge)
