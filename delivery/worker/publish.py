"""``delivery.worker.publish``: how the relay and the post-commit nudge publish tasks.

``publish(claims)`` sends the tasks of claimed rows through Celery's own ``apply_async``, so
whatever watches Celery's publishing sees them as it sees any task: ``before_task_publish``
and ``after_task_publish`` fire for each (OpenTelemetry's and Sentry's Celery integrations
record the producer side and link it to the worker's), and the ``task_routes`` you configure
are honoured (``task-sent`` events stay off, Celery's default: docs/deployment.md). A task
carries message ids and keys only, never a recipient or a payload: its args, its
``argsrepr`` header and its events name nothing else.

- A message alone is a ``delivery.deliver`` task, args ``(id, key)``, whose task id is the
  message's key: Flower finds a message by its key, and a message published again (parked,
  lease lost) keeps its task id. Its ``retries`` are the attempts the message already had.
- A backlog of at least ``batch_size`` messages of one queue goes as ``delivery.deliver_batch``
  tasks of up to ``batch_size`` ``[id, key]`` pairs, task id ``batch-<uuid>`` (its worker
  reports each message under its own key: ``delivery.worker.batch``).
- The queue is the message type's priority's: ``delivery.urgent``, ``delivery`` or
  ``delivery.bulk`` (docs/concepts.md, "Message types, priorities, time-to-live, schedules and
  rate limits"), unless a route of ``task_routes`` names the task: Celery then sends it where
  that route says (the relay's back-pressure counts only the three delivery queues).
- One call holds one producer (one pooled broker connection) for all its tasks and, where
  kombu can (``Producer.batch``, Redis), sends two or more in one pipeline when the call ends.
- A failure raises, after kombu's retry policy (``PUBLISH_RETRY``: about 1.5 s at most, a
  connection that died with the broker is revived and the task sent again); the relay then
  puts the rows back to ``pending``.

Returns the tasks published per priority: the relay's back-pressure counts tasks.

``publish`` is also the post-commit nudge, installed into ``delivery.outbox.enqueue`` when this
module is imported: a due row enqueued while it is installed is written claimed, and its task is
published here right after the caller's commit.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from celery import Task

from delivery.observability import tracing
from delivery.outbox import enqueue as outbox
from delivery.relay.claims import Claim
from delivery.runtime.current import get_settings
from delivery.worker.app import QUEUE, QUEUES, app
from delivery.worker.batch import deliver_batch
from delivery.worker.deliver import deliver

__all__ = ["PUBLISH_RETRY", "batches", "publish"]

#: kombu's retry policy for one publish: about 1.5 s at most before the relay gives the rows back.
PUBLISH_RETRY = {"max_retries": 3, "interval_start": 0.0, "interval_step": 0.5, "interval_max": 1.0}


def batches(claims: Sequence[Claim], size: int) -> list[list[Claim]]:
    """Split ``claims`` into tasks: per queue, a backlog of at least ``size`` messages goes in
    chunks of at most ``size`` of even length (120 at 50: 40 + 40 + 40, not 50 + 50 + 20);
    fewer than ``size`` (a nudge, a quiet relay pass) go one per task (``delivery.deliver``),
    spread over every worker slot as before, and latency never waits for a batch to fill."""
    by_queue: dict[str, list[Claim]] = {}
    for claim in claims:
        by_queue.setdefault(claim.priority, []).append(claim)
    chunks: list[list[Claim]] = []
    for group in by_queue.values():
        if size <= 1 or len(group) < size:
            chunks.extend([claim] for claim in group)
            continue
        count = -(-len(group) // size)
        step = -(-len(group) // count)
        chunks.extend(group[i : i + step] for i in range(0, len(group), step))
    return chunks


class _Send(NamedTuple):
    """One ``apply_async`` call of ``publish``."""

    task: Task
    args: tuple[Any, ...]
    task_id: str
    retries: int
    priority: str
    queue: str | None  # None: a configured route names the task
    claims: Sequence[Claim]  # its messages (their traces: ``tracing.publishing``)


def _plan(chunk: Sequence[Claim]) -> _Send:
    first = chunk[0]
    task: Task
    args: tuple[Any, ...]
    if len(chunk) == 1:
        task, args = deliver, (first.id, first.key)
        task_id, retries = first.key, first.attempts
    else:
        task, args = deliver_batch, ([[c.id, c.key] for c in chunk],)
        task_id, retries = f"batch-{uuid.uuid4()}", 0
    router = app.amqp.router
    routed = bool(router.routes) and router.lookup_route(task.name, args, {}, {}, task) is not None
    queue = None if routed else QUEUES.get(first.priority, QUEUE)
    return _Send(task, args, task_id, retries, first.priority, queue, chunk)


def publish(claims: Sequence[Claim]) -> dict[str, int]:
    """Publish the tasks of the claimed rows with ``apply_async`` (see the module); return the
    tasks published per priority. Raises if the broker would not take them."""
    published: dict[str, int] = {}
    if not claims:
        return published
    sends = [_plan(chunk) for chunk in batches(claims, get_settings().batch_size)]
    declared: set[str] = set()
    with app.producer_or_acquire() as producer:
        # kombu >= 5.7: many tasks in one Redis pipeline; one task (a nudge) goes as it is,
        # since the pipeline's session costs more than the round trip it would save.
        batch = getattr(producer, "batch", None) if len(sends) > 1 else None
        with batch(max_size=2 * len(sends)) if batch else contextlib.nullcontext():
            for send in sends:
                route: dict[str, Any] = {}
                if send.queue is not None:
                    # The first task to a queue declares it, as apply_async does; the others
                    # skip the check (kombu would bind a copy of the queue to ask). A routed
                    # task's queue is declared by Celery, as for any task.
                    route["queue"] = send.queue
                    if send.queue in declared:
                        route["declare"] = []
                    declared.add(send.queue)
                with tracing.publishing(send.claims, send.queue, send.task_id) as headers:
                    send.task.apply_async(
                        send.args,
                        task_id=send.task_id,
                        producer=producer,
                        # Flower's "retries": the attempts the message already had, so that a
                        # message published again does not start counting at 0.
                        retries=send.retries,
                        retry=True,
                        retry_policy=PUBLISH_RETRY,
                        add_to_parent=False,  # a relay run as a task keeps no list of its tasks
                        headers=headers,  # the send span's trace context, when tracing
                        **route,
                    )
                published[send.priority] = published.get(send.priority, 0) + 1
    return published


outbox.set_nudge(publish)  # the post-commit nudge publishes the rows enqueue wrote claimed
