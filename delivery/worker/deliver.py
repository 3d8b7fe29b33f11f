"""``delivery.deliver``: one attempt for one message, and the publisher the relay uses.

What each outcome looks like in Flower (events; the outbox row stays the record):

- ``SUCCESS``, result ``sent``: the provider accepted it.
- ``RETRY`` with an ETA: a short retry (Celery countdown, at most ``max_countdown``).
- ``PARKED`` (a custom state, sent as a ``task-parked`` event), result ``parked: CODE until
  TIME ...``: back in the outbox as ``pending`` (open breaker, long backoff, Retry-After); the
  relay publishes it again when due, under the same task id.
- ``FAILURE`` with ``DeadLettered``: it ended ``dead``, ``unknown`` or ``expired``; its result
  field (set by a ``task-dead-lettered`` event) names the status and error code, so Flower's
  search finds ``21211`` or ``result:dead``.
- ``SUCCESS``, result ``skipped: ...``: a duplicate or late task that had nothing to do.

``retries`` counts the provider attempts the message had before this task ran, across
republishes (the relay publishes with the row's attempt count).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from celery import Task
from celery.exceptions import Ignore

from delivery.errors import ConfigError
from delivery.pipeline import outbox
from delivery.pipeline.relay import Claim
from delivery.pipeline.sender import Action
from delivery.pipeline.sender import deliver as deliver_once
from delivery.runtime.current import get_settings
from delivery.worker.app import QUEUE, QUEUES, app, service

__all__ = ["BATCH", "DeadLettered", "announce", "batches", "deliver", "publish"]

#: kombu's retry policy for one publish: about 1.5 s at most before the relay gives the rows back.
PUBLISH_RETRY = {"max_retries": 3, "interval_start": 0.0, "interval_step": 0.5, "interval_max": 1.0}
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class DeadLettered(Exception):
    """Raised by the task when its message ends ``dead`` or ``unknown`` so that Flower shows it
    as a failed task. It names the error code, the message id and key, never the provider's
    text; the outbox row holds the full story (``delivery show KEY``)."""


log = logging.getLogger("delivery.tasks")

_NOT_DELIVERED = {
    "dead": "in the dead-letter status (dead)",
    "unknown": "parked as unknown for review (it may have been delivered)",
    "expired": "expired: its time-to-live passed before it could be sent (never sent)",
}


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


@app.task(name="delivery.deliver", bind=True, max_retries=None, throws=(DeadLettered,))  # type: ignore[untyped-decorator]
def deliver(self: Task, message_id: int, key: str) -> str:
    """Carries only the message id and key (no recipient, no body): guarantee G6."""
    result = deliver_once(service(), message_id, key)
    if result.action is Action.RETRY and result.delay is not None:
        raise self.retry(countdown=result.delay, max_retries=None)
    if result.action is Action.PARKED:
        due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=result.delay or 0.0)
        announce(
            self,
            "parked",
            f"parked: {result.code} until {due.isoformat(timespec='seconds')}; back in the "
            "outbox as pending, no attempt spent; the relay publishes it again then",
        )
        raise Ignore()  # acknowledged; no success event, so Flower keeps PARKED
    if result.action is Action.DONE and result.status in _NOT_DELIVERED:
        announce(self, "dead-lettered", f"{result.status}: {result.code}")
        # The code, the id and the key only: this text reaches the worker log, the broker's
        # task-failed event and Flower, so never the provider's reason (G6).
        raise DeadLettered(
            f"{result.code}: message {message_id} is {_NOT_DELIVERED[result.status]}; "
            f"delivery show {key!r}, delivery redrive to send it again"
        )
    if result.action is Action.SKIP:
        return f"skipped: {result.reason}"
    return result.status or result.action.value


class _Template(NamedTuple):
    """What every message of one task shares, built once per process by Celery itself."""

    headers: dict[str, Any]
    options: dict[str, Any]
    queues: list[Any]


BATCH = "delivery.deliver_batch"
_templates: dict[str, _Template] = {}


def _message_template(name: str = "delivery.deliver") -> _Template:
    template = _templates.get(name)
    if template is None:
        # Celery's own protocol-2 builder, so that the messages match what apply_async sends.
        message = app.amqp.as_task_v2("-", name, (0, "-"), {}, ignore_result=True)
        queue = app.amqp.queues[QUEUE]
        options = dict(
            exchange="",  # the default exchange: routing key = queue, no binding lookup
            delivery_mode=queue.exchange.delivery_mode or app.conf.task_default_delivery_mode,
            serializer=app.conf.task_serializer,
            compression=app.conf.task_compression,
            # A connection that died with the broker (restart, failover) is revived and the
            # message sent again, briefly; past that the relay puts the rows back to pending.
            retry=True,
            retry_policy=PUBLISH_RETRY,
            reply_to=app.thread_oid,  # as apply_async sets it (unused: results are ignored)
        )
        queues = [app.amqp.queues[name] for name in QUEUES.values()]
        template = _templates[name] = _Template(dict(message.headers), options, queues)
    return template


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


def publish(claims: Sequence[Claim]) -> dict[str, int]:
    """Publish the claimed rows: a ``delivery.deliver`` task for a message alone (args ``(id,
    key)``, task id = key: Flower finds a message by its key), a ``delivery.deliver_batch``
    task for up to ``batch_size`` messages of one queue (args ``([[id, key], ...],)``; its
    worker sends Flower per-message events under each key, ``delivery.worker.batch``). Return the
    tasks published per priority (the relay's back-pressure counts tasks).

    Fast path for the relay and the nudge: one held producer connection, Celery protocol-2
    messages built from a per-process template (no ``apply_async`` per task), sent to the
    default exchange with the routing key of the message's queue (``delivery``, or
    ``delivery.urgent`` / ``delivery.bulk`` by its type's priority) and, where kombu can
    (``Producer.batch``, kombu >= 5.7 on Redis), buffered into one pipeline per call. No
    ``task-sent`` events or publish signals are sent; the worker's events show the task in
    Flower. A failure raises, and the relay puts the rows back to ``pending``."""
    published: dict[str, int] = {}
    if not claims:
        return published
    single, batch_template = _message_template(), _message_template(BATCH)
    chunks = batches(claims, get_settings().batch_size)
    with app.producer_or_acquire() as producer:
        # kombu's own cache of what this connection declared, asked first: maybe_declare
        # binds a copy of the queue before it looks (0.06 ms a queue, three per publish).
        declared = getattr(producer.connection, "declared_entities", ())
        for queue in single.queues:
            if hash(queue) not in declared:
                producer.maybe_declare(queue)
        batch = getattr(producer, "batch", None)
        with batch(max_size=max(len(chunks), 1)) if batch else contextlib.nullcontext():
            for chunk in chunks:
                first = chunk[0]
                if len(chunk) == 1:
                    args: tuple[Any, ...] = (first.id, first.key)
                    task_id, retries, headers = first.key, first.attempts, single.headers
                else:
                    args = ([[c.id, c.key] for c in chunk],)
                    task_id, retries, headers = f"batch-{uuid.uuid4()}", 0, batch_template.headers
                producer.publish(
                    (args, {}, _EMBED),
                    headers={
                        **headers,
                        "id": task_id,
                        "root_id": task_id,
                        "argsrepr": repr(args),
                        # Flower's "retries": the attempts the message already had, so a
                        # republished message does not start counting again at 0.
                        "retries": retries,
                    },
                    correlation_id=task_id,
                    routing_key=QUEUES.get(first.priority, QUEUE),
                    **single.options,
                )
                published[first.priority] = published.get(first.priority, 0) + 1
    return published


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
outbox.set_nudge(publish)  # the post-commit nudge publishes through it
