"""The worker's lease keeper: renews the leases of the messages this worker holds.

Started on ``worker_ready`` in the worker's main process (the one that reserves tasks from the
broker, for every pool), stopped on ``worker_shutdown``. Every ``hold_lease / 3`` s it reads
the ``delivery.deliver`` requests the worker has reserved or is running
(``celery.worker.state``) and renews their rows in one round trip
(``delivery.pipeline.leases.renew_held``), on an engine of its own created after the pool
forked. A killed worker stops renewing, and beat's sweeper returns its messages
``hold_lease`` s later (10 s by default) instead of after the relay's ``dispatch_lease``.
A failing renewal is logged (once a minute at most) by the loop and tried again.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from celery.worker import state
from sqlalchemy import Engine

from delivery.pipeline.leases import Renewed, renew_held
from delivery.runtime.current import get_settings
from delivery.runtime.db import make_engine
from tasks.schedule import Loop

__all__ = ["held_ids", "renew_once", "start_keeper", "stop_keeper"]

log = logging.getLogger("delivery.worker")

DELIVER = "delivery.deliver"

_keeper: Loop | None = None
_engine: Engine | None = None


def held_ids() -> set[int]:
    """Message ids of the deliver tasks this worker has reserved or is running."""
    ids: set[int] = set()
    for _ in range(3):  # the sets change under us while the consumer works; try again
        try:
            requests = [*state.reserved_requests, *state.active_requests]
            break
        except RuntimeError:
            continue
    else:
        requests = list(state.requests.values())
    for request in requests:
        if getattr(request, "name", None) != DELIVER:
            continue
        args = getattr(request, "args", None) or ()
        if args and isinstance(args[0], int):
            ids.add(args[0])
    return ids


def renew_once(engine: Engine) -> Renewed:
    """One renewal of every message this worker holds."""
    settings = get_settings()
    ids = held_ids()
    if not ids:
        return Renewed(0, 0)
    with engine.begin() as conn:
        return renew_held(conn, ids, hold_lease=settings.hold_lease, send_lease=settings.send_lease)


def start_keeper() -> Loop:
    """Start this process's lease keeper (once)."""
    global _keeper, _engine
    if _keeper is None:
        settings = get_settings()
        _engine = make_engine(settings.database_url, pool_size=1, max_overflow=1)
        engine = _engine
        _keeper = Loop("leases", settings.hold_lease / 3.0, lambda: renew_once(engine))
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
