"""The worker's lease keeper: renews the leases of the messages this worker holds.

Started on ``worker_ready`` in the worker's main process (the one that reserves tasks from the
broker, for every pool), stopped on ``worker_shutdown``. It renews the messages of each task
the consumer takes from the broker at once (Celery's ``task_received``, prefetched tasks
included: no polling), and every ``hold_lease / 3`` s the ``delivery.deliver`` and
``delivery.deliver_batch`` requests the worker has reserved, is running or holds for a
countdown (``celery.worker.state``), in one round trip (``delivery.sending.leases.renew_held``)
on an engine of its own created after the pool forked. A failing renewal is logged (once a
minute at most) by the loop and tried again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from celery.signals import task_received, worker_ready, worker_shutdown
from celery.worker import state
from sqlalchemy import Engine

from delivery.runtime.current import get_settings
from delivery.runtime.db import make_engine
from delivery.sending.leases import Renewed, renew_held
from delivery.worker.deliver import BATCH, DELIVER
from delivery.worker.schedule import Loop

__all__ = ["Keeper", "held_ids", "renew_once", "start_keeper", "stop_keeper"]

log = logging.getLogger("delivery.worker")


class Keeper(Loop):
    """The renewal loop: renews what the worker holds every ``interval`` s, and the messages
    ``received`` hands it as soon as it can (one UPDATE for all that came meanwhile)."""

    def __init__(self, interval: float, renew: Callable[[set[int]], Any]) -> None:
        super().__init__("leases", interval, lambda: None)
        self._renew = renew
        self._lock = threading.Lock()
        self._new: set[int] = set()
        self._wake = threading.Event()

    def received(self, *message_ids: int) -> None:
        """The worker took the task of ``message_ids`` from the broker: renew them now."""
        with self._lock:
            self._new.update(message_ids)
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        self._wake.set()
        super().stop(timeout)

    def run(self) -> None:
        due = time.monotonic()
        while not self._stopped.is_set():
            self._wake.wait(max(0.0, due - time.monotonic()))
            if self._stopped.is_set():
                break
            self._wake.clear()
            with self._lock:
                ids, self._new = self._new, set()
            try:
                if time.monotonic() >= due:
                    due = time.monotonic() + self.interval
                    ids |= held_ids()
                if ids:
                    self._renew(ids)
            except Exception as exc:
                self._failed(exc)
                with self._lock:  # try these again with the next wake-up
                    self._new |= ids
            self.passes += 1


_keeper: Keeper | None = None
_engine: Engine | None = None


def _message_ids(request: Any) -> list[int]:
    """The message ids a deliver request carries: one, or every message of a batch."""
    name = getattr(request, "name", None)
    args = getattr(request, "args", None) or ()
    if name == DELIVER and args and isinstance(args[0], int):
        return [args[0]]
    if name == BATCH and args and isinstance(args[0], list | tuple):
        # a batch holds every message it carries: [[id, key], ...]
        return [pair[0] for pair in args[0] if pair and isinstance(pair[0], int)]
    return []


def held_ids() -> set[int]:
    """Message ids of the deliver tasks (and of every message of a batch task) this worker has
    reserved, is running, or holds until their countdown."""
    ids: set[int] = set()
    for _ in range(3):  # the sets change under us while the consumer works; try again
        try:
            requests = [
                *state.reserved_requests,
                *state.active_requests,
                *getattr(state, "scheduled_requests", ()),  # countdown retries (Celery 5.5)
            ]
            break
        except RuntimeError:
            continue
    else:
        requests = list(state.requests.values())
    for request in requests:
        ids.update(_message_ids(request))
    return ids


def renew_once(engine: Engine, ids: set[int] | None = None) -> Renewed:
    """One renewal of the messages this worker holds (``ids``, default: ``held_ids()``)."""
    settings = get_settings()
    ids = held_ids() if ids is None else ids
    if not ids:
        return Renewed(0, 0)
    with engine.begin() as conn:
        return renew_held(conn, ids, hold_lease=settings.hold_lease, send_lease=settings.send_lease)


def start_keeper() -> Keeper:
    """Start this process's lease keeper (once)."""
    global _keeper, _engine
    if _keeper is None:
        settings = get_settings()
        _engine = make_engine(settings.database_url, pool_size=1, max_overflow=1)
        engine = _engine
        _keeper = Keeper(settings.hold_lease / 3.0, lambda ids: renew_once(engine, ids))
        _keeper.start()
        log.info(
            "renewing the leases of held messages on receipt and every %g s (hold_lease %g s)",
            settings.hold_lease / 3.0,
            settings.hold_lease,
        )
    return _keeper


def stop_keeper() -> None:
    global _keeper, _engine
    if _keeper is not None:
        _keeper.stop()
        _keeper = None
    if _engine is not None:
        _engine.dispose()
        _engine = None


@task_received.connect  # type: ignore[untyped-decorator]
def _task_received(request: Any = None, **_: Any) -> None:
    keeper, ids = _keeper, _message_ids(request)
    if keeper is not None and ids:
        keeper.received(*ids)


@worker_ready.connect  # type: ignore[untyped-decorator]
def _worker_ready(**_: Any) -> None:
    start_keeper()


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _worker_shutdown(**_: Any) -> None:
    stop_keeper()
