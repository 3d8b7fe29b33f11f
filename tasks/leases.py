"""The worker's lease keeper: renews the leases of the messages this worker holds.

Started on ``worker_ready`` in the worker's main process (the one that reserves tasks from the
broker, for every pool), stopped on ``worker_shutdown``. Every ``hold_lease / 3`` s, and
within ``POLL`` s of the worker receiving a task, it reads
the ``delivery.deliver`` and ``delivery.deliver_batch`` requests (every message a batch
carries) the worker has reserved, is running or holds for a
countdown (``celery.worker.state``) and renews their rows in one round trip
(``delivery.pipeline.leases.renew_held``), on an engine of its own created after the pool
forked. A killed worker stops renewing, and beat's sweeper returns its messages
``hold_lease`` s later (10 s by default) instead of after the relay's ``dispatch_lease``.
A failing renewal is logged (once a minute at most) by the loop and tried again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from celery.worker import state
from sqlalchemy import Engine

from delivery.pipeline.leases import Renewed, renew_held
from delivery.runtime.current import get_settings
from delivery.runtime.db import make_engine
from tasks.schedule import Loop

__all__ = ["Keeper", "held_ids", "renew_once", "start_keeper", "stop_keeper"]

log = logging.getLogger("delivery.worker")

DELIVER = "delivery.deliver"
DELIVER_BATCH = "delivery.deliver_batch"


class Keeper(Loop):
    """The renewal loop. It looks at the worker's requests (in memory) every ``POLL`` s and
    renews in the database every ``interval`` s, and at once when a message it has not yet
    renewed shows up, so that a message's relay lease is replaced by the short one right
    after the worker takes it."""

    def __init__(self, interval: float, renew: Callable[[set[int]], Any]) -> None:
        super().__init__("leases", interval, lambda: None)
        self._renew = renew

    def run(self) -> None:
        renewed: set[int] = set()
        last = float("-inf")
        while not self._stopped.wait(POLL):
            try:
                ids = held_ids()
                if not ids - renewed and time.monotonic() - last < self.interval:
                    continue
                last = time.monotonic()
                self._renew(ids)
                renewed = ids
            except Exception as exc:
                self._failed(exc)
                renewed = set()
            self.passes += 1


#: How often the keeper looks for newly received messages (seconds; in memory, no I/O).
POLL = 0.02

_keeper: Keeper | None = None
_engine: Engine | None = None


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
        name = getattr(request, "name", None)
        args = getattr(request, "args", None) or ()
        if name == DELIVER and args and isinstance(args[0], int):
            ids.add(args[0])
        elif name == DELIVER_BATCH and args and isinstance(args[0], list | tuple):
            # a batch holds every message it carries: [[id, key], ...]
            ids.update(pair[0] for pair in args[0] if pair and isinstance(pair[0], int))
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
            "renewing the leases of held messages every %g s (hold_lease %g s)",
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


@worker_ready.connect  # type: ignore[untyped-decorator]
def _worker_ready(**_: Any) -> None:
    start_keeper()


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _worker_shutdown(**_: Any) -> None:
    stop_keeper()
