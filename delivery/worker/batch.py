"""``delivery.deliver_batch``: many messages in one task (``delivery.sending.sender``).

The relay publishes a backlog in tasks of up to ``batch_size`` ``[id, key]`` pairs (never a
recipient or a body: G6); a message alone still goes as ``delivery.deliver``.

Flower builds its task list from task events, so the batch's worker sends, for every message,
the events its own ``delivery.deliver`` task would have sent, with the message's key as the
task id and ``delivery.deliver`` as its name: ``task-received`` and ``task-started`` before the
sends, then ``task-succeeded`` (``sent via PROVIDER``, or ``skipped: ...``),
``task-dead-lettered`` and ``task-failed`` (``DeadLettered`` naming the code), ``task-parked``,
or ``task-retried`` with its countdown, the results a single task would have
(``delivery.worker.deliver``). They are buffered and published together (two ``task.multi``
messages per batch, from the process's events thread, in order: the batch never waits for
them), and only when the worker sends task events (``worker_send_task_events``). A
message the batch must retry shortly (rate limit, a countdown of at most ``max_countdown``)
is republished as its own ``delivery.deliver`` task with that countdown and the key as task
id, exactly like a single task's retry; the batch task itself never retries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import Celery, Task
from celery.events.dispatcher import EventDispatcher
from celery.utils.time import utcoffset

from delivery.sending.sender import deliver_many
from delivery.transitions import Action, Result
from delivery.worker.app import app, service
from delivery.worker.deliver import (
    _NOT_DELIVERED,
    BATCH,
    dead_lettered,
    deliver,
    outcome_text,
    parked_text,
)

__all__ = ["deliver_batch"]

log = logging.getLogger("delivery.tasks")

#: This thread's event dispatcher, kept between batches, and the (pid, hostname) it is for.
_kept = threading.local()


def _publish(app: Celery, hostname: str, events: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Publish ``events`` ((type, fields)) as one ``task.multi`` message, as Celery's
    dispatcher flushes a buffered group: the same fields, one clock tick each. One broker
    connection per thread, made again after a fork or a failed publish: no producer from the
    pool per batch."""
    d: EventDispatcher | None = getattr(_kept, "dispatcher", None)
    if d is None or getattr(_kept, "owner", None) != (os.getpid(), hostname):
        d = app.events.Dispatcher(
            app.connection_for_write(), hostname=hostname, buffer_while_offline=False
        )
        _kept.dispatcher, _kept.owner = d, (os.getpid(), hostname)
    # One lock round for the batch's clock values (LamportClock.adjust: the value after is at
    # least the one before plus len(events)).
    last = d.clock.adjust(d.clock.value + len(events) - 1)
    first = last - len(events) + 1
    common = {"hostname": d.hostname, "utcoffset": utcoffset(), "pid": d.pid}
    now = time.time()
    body = [
        {**common, **fields, "clock": first + i, "timestamp": now, "type": kind}
        for i, (kind, fields) in enumerate(events)
    ]
    try:
        d.producer.publish(
            body,
            routing_key="task.multi",
            exchange=d.exchange.name,
            declare=[d.exchange],
            serializer=d.serializer,
            headers=d.headers,
            delivery_mode=d.delivery_mode,
        )
    except Exception:
        _kept.dispatcher = None
        with contextlib.suppress(Exception):
            d.close()
            d.connection.close()
        raise


class _Events:
    """Per-message task events of one batch, buffered and sent together."""

    def __init__(self, task: Task, pairs: Sequence[tuple[int, str]]) -> None:
        self.task, self.pairs = task, pairs
        self.enabled = bool(task.app.conf.worker_send_task_events)
        self.buffer: list[tuple[str, dict[str, Any]]] = []
        self.started = time.monotonic()

    def add(self, kind: str, key: str, **fields: Any) -> None:
        if self.enabled:
            self.buffer.append((kind, {"uuid": key, **fields}))

    def received(self, attempts: Mapping[int, int]) -> None:
        for message_id, key in self.pairs:
            self.add(
                "task-received",
                key,
                name=deliver.name,
                args=repr((message_id, key)),
                kwargs="{}",
                root_id=key,
                parent_id=None,
                retries=attempts.get(message_id, 0),
                eta=None,
                expires=None,
            )
        for _, key in self.pairs:
            self.add("task-started", key)
        self.flush()

    def flush(self) -> None:
        """Publish the buffered events in one message, on this process's events thread, in
        order, so that neither publish waits in the batch's path (the sends start as soon as
        the rows are read; the next task starts while the last events go out). A failure is
        logged: events are a view, never a reason to fail a delivery."""
        if not self.buffer:
            return
        events, self.buffer = self.buffer, []
        app, request = self.task.app, self.task.request
        _events_thread().submit(_publish_logged, app, request.hostname, request.id, events)


def _publish_logged(
    app: Celery, hostname: str, batch: str, events: Sequence[tuple[str, dict[str, Any]]]
) -> None:
    try:
        _publish(app, hostname, events)
    except Exception as exc:
        log.warning("could not send the events of batch %s: %r", batch, exc)


_thread: tuple[int, ThreadPoolExecutor] | None = None
_thread_lock = threading.Lock()


def _events_thread() -> ThreadPoolExecutor:
    """This process's one thread that publishes batches' events (made again after a fork)."""
    global _thread
    with _thread_lock:
        if _thread is None or _thread[0] != os.getpid():
            _thread = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="delivery-events"))
        return _thread[1]


def _retry(task: Task, message_id: int, key: str, result: Result, attempts: int) -> None:
    """Republish one message of the batch as its own ``delivery.deliver`` task, due in
    ``result.delay`` s (the row stays ``dispatched``; its lease covers the wait)."""
    delay = result.delay or 0.0
    routing = (task.request.delivery_info or {}).get("routing_key")
    try:
        deliver.apply_async(
            (message_id, key),
            task_id=key,
            countdown=delay,
            retries=attempts,
            **({"queue": routing} if routing else {}),
        )
    except Exception as exc:  # the lease runs out and the sweeper gives the row back
        log.warning("could not republish message %s for its retry: %r", message_id, exc)


@app.task(name=BATCH, bind=True, max_retries=None, ignore_result=True)  # type: ignore[untyped-decorator]
def deliver_batch(self: Task, pairs: Sequence[Sequence[Any]]) -> str:
    """Carries only ``[id, key]`` pairs (no recipient, no body): guarantee G6."""
    messages = [(int(message_id), str(key)) for message_id, key in pairs]
    events = _Events(self, messages)
    seen: dict[int, int] = {}

    def read(attempts: Mapping[int, int]) -> None:
        seen.update(attempts)
        events.received(attempts)

    answers = deliver_many(service(), messages, on_read=read)
    counts: dict[str, int] = {}
    runtime = time.monotonic() - events.started
    for (message_id, key), result in zip(messages, answers, strict=True):
        what = _report(self, events, (message_id, key), result, seen.get(message_id, 0))
        counts[what] = counts.get(what, 0) + 1
        if what == "sent":
            events.add("task-succeeded", key, result=outcome_text(result), runtime=runtime)
    events.flush()
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))


def _report(
    task: Task, events: _Events, message: tuple[int, str], result: Result, attempts: int
) -> str:
    """Buffer the events of one message's answer (and republish a retry); its one-word kind."""
    message_id, key = message
    runtime = time.monotonic() - events.started
    if result.action is Action.RETRY and result.delay is not None:
        events.add(
            "task-retried",
            key,
            exception=f"Retry(in {result.delay}s)",
            traceback=f"celery.exceptions.Retry: Retry in {result.delay}s",
        )
        # The event's time is the retry's: the republished task's ETA is that plus delay.
        _retry(task, message_id, key, result, attempts + 1)  # as Task.retry counts
        return "retried"
    if result.action is Action.PARKED:
        events.add("task-parked", key, result=parked_text(result))
        return "parked"
    if result.action is Action.DONE and result.status in _NOT_DELIVERED:
        events.add("task-dead-lettered", key, result=outcome_text(result))
        error = dead_lettered(result, message_id, key)
        events.add("task-failed", key, exception=repr(error), traceback="")
        return str(result.status)
    if result.action is Action.SKIP:
        events.add("task-succeeded", key, result=f"skipped: {result.reason}", runtime=runtime)
        return "skipped"
    return str(result.status or result.action.value)
