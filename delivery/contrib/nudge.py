"""The post-commit nudge, as seen from the framework integrations.

The Celery app ``delivery.worker`` installs the nudge when it is imported
(``delivery.pipeline.outbox.set_nudge``): after the caller's commit it claims the new rows
and publishes their tasks at once, so a message does not wait for the next beat tick (the
beat relay remains the safety net). The integrations import ``delivery.worker`` only when asked to
(``DELIVERY_NUDGE``, true by default), never at import time, so ``delivery`` itself stays
free of Celery; ``install_nudge_on_first_commit`` defers that import to the first commit that
nudges.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence

from sqlalchemy import Engine

from delivery.pipeline import outbox
from delivery.runtime.current import get_settings
from delivery.runtime.db import make_engine

__all__ = ["install_nudge", "install_nudge_on_first_commit", "installed", "nudge_after_commit"]

log = logging.getLogger("delivery.contrib")
_lock = threading.Lock()
_engine: Engine | None = None


def install_nudge() -> None:
    """Import the Celery app ``delivery.worker``, which installs the nudge and reads the settings
    configured so far (configure them first)."""
    importlib.import_module("delivery.worker")


def install_nudge_on_first_commit() -> None:
    """Install a nudge that imports ``delivery.worker`` (``install_nudge``) at the first commit
    that needs it, then hands over to the real one: a process whose settings are not complete
    for publishing (no broker) starts, and fails only where it would publish. A failing import
    is logged by the commit's caller, which leaves the rows to the beat relay."""
    outbox.set_nudge(_nudge_on_first_commit)


def _nudge_on_first_commit(engine: Engine, ids: list[int]) -> None:
    install_nudge()
    nudge = outbox._nudge
    if nudge is not None and nudge is not _nudge_on_first_commit:
        nudge(engine, ids)


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


def nudge_after_commit(ids: Sequence[int]) -> None:
    """Run the installed nudge for ``ids`` (the caller's transaction has committed).

    A failure is logged, never raised: the rows are committed and the beat relay will
    publish them.
    """
    nudge = outbox._nudge
    if nudge is None or not ids:
        return
    try:
        nudge(_outbox_engine(), list(ids))
    except Exception:
        log.warning("post-commit nudge failed; the relay will publish the messages", exc_info=True)
