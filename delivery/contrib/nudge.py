"""The post-commit nudge, as seen from the framework integrations.

The Celery app ``delivery.worker`` installs the nudge when it is imported
(``delivery.outbox.enqueue.set_nudge``): a due message enqueued while it is installed is
written already claimed, and its task is published once the caller has committed, instead of
at the next beat tick. The integrations import ``delivery.worker`` only when asked to
(``DELIVERY_NUDGE``, true by default), never at import time, so ``delivery`` stays free of
Celery. Django commits itself: it hands the claimed rows to ``publish_after_commit``, and the
rows a redrive put back to ``pending`` to ``nudge_after_commit``, which claims them first.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence

from sqlalchemy import Engine

from delivery.outbox import enqueue as outbox
from delivery.relay.claims import Claim, relay_once
from delivery.runtime.current import get_settings
from delivery.runtime.db import make_engine

__all__ = [
    "install_nudge",
    "install_nudge_on_first_commit",
    "installed",
    "nudge_after_commit",
    "publish_after_commit",
]

log = logging.getLogger("delivery.contrib")
_lock = threading.Lock()
_engine: Engine | None = None


def install_nudge() -> None:
    """Import the Celery app ``delivery.worker``, which installs the nudge and reads the settings
    configured so far (configure them first)."""
    importlib.import_module("delivery.worker")


def install_nudge_on_first_commit() -> None:
    """Install a nudge that imports ``delivery.worker`` at the first commit that needs it, then
    hands over to the real one: a process without a broker starts, and fails only where it
    would publish (``outbox.publish_claimed`` logs it and gives the rows back to the relay)."""
    outbox.set_nudge(_nudge_on_first_commit)


def _nudge_on_first_commit(claims: Sequence[Claim]) -> object:
    install_nudge()
    nudge = outbox._nudge
    if nudge is None or nudge is _nudge_on_first_commit:
        raise RuntimeError("delivery.worker installed no nudge")
    return nudge(claims)


def installed() -> bool:
    """Whether a nudge is installed in this process."""
    return outbox._nudge is not None


def _outbox_engine() -> Engine:
    """An engine of this process on the configured outbox, for the nudge's own transaction."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = make_engine(get_settings().database_url)
        return _engine


def publish_after_commit(claims: Sequence[Claim]) -> None:
    """Publish the rows the caller's transaction wrote claimed (``outbox.take_claims``); it
    has committed. Never raises (``outbox.publish_claimed``)."""
    try:
        engine = _outbox_engine()
    except Exception:
        log.warning("post-commit nudge failed; the relay will publish the messages", exc_info=True)
        return
    outbox.publish_claimed(engine, claims)


def nudge_after_commit(ids: Sequence[int]) -> None:
    """Claim and publish the due ``pending`` rows of ``ids`` (``outbox.NUDGE_MAX`` at most) as
    one relay batch would, once the caller has committed. A failure is logged, never raised:
    the beat relay will publish them."""
    publisher = outbox._nudge
    ids = list(ids)[: outbox.NUDGE_MAX]  # the relay publishes the rest
    if publisher is None or not ids:
        return
    try:
        relay_once(
            _outbox_engine(),
            publisher,
            batch=len(ids),
            lease=get_settings().dispatch_lease,
            ids=ids,
            max_batches=1,
        )
    except Exception:
        log.warning("post-commit nudge failed; the relay will publish the messages", exc_info=True)
