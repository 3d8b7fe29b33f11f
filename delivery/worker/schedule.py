"""The relay and the sweeper, run by ``celery beat`` itself.

``celery -A delivery.worker beat`` starts its threads in the beat process (``beat_init``): the
relay (publish due rows, every ``relay_interval`` s, as many as each broker queue has room
for: ``delivery.relay.backpressure``; and renew the leases of the rows whose tasks still wait
in a queue: ``delivery.sending.leases.renew_queued``), the sweeper (expired leases and
time-to-live, every ``sweep_interval`` s) and, on a partitioned outbox, the coming days'
partitions and the freeing of dropped days' keys (every hour:
``delivery.runtime.partitions.ensure_ahead`` and ``free_keys``). They talk to the
database and publish to the broker directly, so they never wait for a free slot in a worker,
never sit in a queue behind sends, never show in Flower, and never depend on a relay *task*
reaching a worker: after the broker restarts or loses its state, the next tick publishes
again. A failing tick (database or broker unreachable) is logged and the loop goes on; one
error is logged with its traceback, repeats only once a minute.

``delivery.relay`` and ``delivery.sweep`` are also Celery tasks, for running one pass by hand
(``celery -A delivery.worker call delivery.relay``); beat does not schedule them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from celery.signals import beat_init

from delivery.relay.backpressure import Backpressure
from delivery.relay.claims import Claim, relay_once
from delivery.relay.sweeper import sweep as sweep_once
from delivery.runtime.partitions import ensure_ahead, free_keys
from delivery.sending.leases import renew_queued
from delivery.worker.app import QUEUES, app, service
from delivery.worker.metrics import metrics
from delivery.worker.publish import publish

__all__ = [
    "FLOOR",
    "PARTITIONS_EVERY",
    "Loop",
    "partitions_pass",
    "queue_depths",
    "relay",
    "relay_pass",
    "start_loops",
    "sweep",
    "sweep_pass",
]

log = logging.getLogger("delivery.beat")

#: A failing loop repeats its error in the log at most this often (seconds).
ERROR_EVERY = 60.0
#: Back-pressure: a queue may always hold this many tasks (or relay_batch, if smaller).
FLOOR = 100
#: How often beat makes sure the coming days' partitions exist (seconds).
PARTITIONS_EVERY = 3600.0


def queue_depths() -> dict[str, int | None]:
    """Tasks waiting in each delivery queue, by priority, as the broker counts them (``None``
    for a queue it did not say: that queue is then not limited)."""
    depths: dict[str, int | None] = dict.fromkeys(QUEUES)
    try:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            for priority, queue in QUEUES.items():
                with contextlib.suppress(Exception):
                    # Declared as the workers declare it, not passively: an empty Redis queue
                    # is no key at all, which a passive declare reports as missing (no depth:
                    # no back-pressure, just when a backlog falls due).
                    declared = app.amqp.queues[queue].bind(channel).queue_declare()
                    depths[priority] = int(declared.message_count)
    except Exception as exc:  # the publish will say what is wrong with the broker
        log.debug("queue depths unavailable: %s", exc)
    return depths


_pressure: Backpressure | None = None


def relay_pass() -> int:
    """One relay pass: renew the leases of the rows whose tasks still wait in a queue
    (``delivery.sending.leases.renew_queued``), then claim and publish the due rows each
    queue has room for (back-pressure, ``delivery.relay.backpressure``); return how
    many."""
    global _pressure
    svc = service()
    settings = svc.settings
    if _pressure is None:
        _pressure = Backpressure(settings.dispatch_lease, min(settings.relay_batch, FLOOR))
    pressure = _pressure
    # The broker counts tasks, and a task carries up to batch_size messages: the rooms are
    # in tasks, the relay's caps and the renewal of queued rows in messages.
    size = max(settings.batch_size, 1)
    depths = queue_depths()
    rooms = {
        queue: None if room is None else room * size
        for queue, room in pressure.rooms(depths, time.monotonic()).items()
    }
    if any(depths.values()):
        queued = {queue: None if depth is None else depth * size for queue, depth in depths.items()}
        with svc.engine.begin() as conn:
            renew_queued(conn, queued, lease=settings.dispatch_lease)

    def counted(claims: Sequence[Claim]) -> None:
        for priority, tasks in publish(claims).items():
            pressure.published(priority, tasks)

    published = relay_once(
        svc.engine,
        counted,
        batch=settings.relay_batch,
        lease=settings.dispatch_lease,
        rooms=rooms,
    )
    metrics.observe_relay(published)
    return published


def sweep_pass() -> dict[str, int]:
    """One sweeper pass; return what it did per kind (logged when it did anything)."""
    done = asdict(sweep_once(service().engine))
    if any(done.values()):
        log.info("sweeper: %s", done)
    return done


def partitions_pass() -> list[str]:
    """Create the coming days' partitions that are missing, then delete the keys of dropped
    days' messages (a partitioned outbox only); the days created."""
    engine = service().engine
    created = ensure_ahead(engine)
    if created:
        log.info("partitions created ahead: %s", ", ".join(created))
    freed = free_keys(engine)
    if freed:
        log.info("keys of dropped days deleted: %d", freed)
    return created


@app.task(name="delivery.relay", ignore_result=True, acks_late=False)  # type: ignore[untyped-decorator]
def relay() -> int:
    return relay_pass()


@app.task(name="delivery.sweep", ignore_result=True, acks_late=False)  # type: ignore[untyped-decorator]
def sweep() -> dict[str, int]:
    return sweep_pass()


class Loop(threading.Thread):
    """Call ``step`` every ``interval`` seconds (start to start) until ``stop``; a failing
    step is logged and the next one runs on time."""

    def __init__(self, name: str, interval: float, step: Callable[[], Any]) -> None:
        super().__init__(name=f"delivery-{name}", daemon=True)
        self.interval, self.step = interval, step
        self._stopped = threading.Event()
        self._last_error: tuple[str, float] | None = None
        self.passes = 0

    def run(self) -> None:
        delay = 0.0
        while not self._stopped.wait(delay):
            started = time.monotonic()
            try:
                self.step()
            except Exception as exc:
                self._failed(exc)
            else:
                if self._last_error is not None:
                    log.warning("%s: recovered", self.name)
                    self._last_error = None
            self.passes += 1
            delay = max(0.0, self.interval - (time.monotonic() - started))

    def _failed(self, exc: Exception) -> None:
        what, now = f"{type(exc).__name__}: {exc}"[:300], time.monotonic()
        last = self._last_error
        if last is None or last[0] != what or now - last[1] >= ERROR_EVERY:
            log.error(
                "%s failed (retrying every %g s): %s",
                self.name,
                self.interval,
                what,
                exc_info=last is None,
            )
            self._last_error = (what, now)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)


_loops: list[Loop] = []


def start_loops() -> list[Loop]:
    """Start the relay and sweeper threads of this process (once)."""
    if not _loops:
        settings = service().settings
        _loops.extend(
            [
                Loop("relay", settings.relay_interval, relay_pass),
                Loop("sweep", settings.sweep_interval, sweep_pass),
                Loop("partitions", PARTITIONS_EVERY, partitions_pass),
            ]
        )
        for loop in _loops:
            loop.start()
        log.info(
            "relay every %g s and sweeper every %g s running in this beat process",
            settings.relay_interval,
            settings.sweep_interval,
        )
    return _loops


@beat_init.connect  # type: ignore[untyped-decorator]
def _beat_started(**_: Any) -> None:
    start_loops()
