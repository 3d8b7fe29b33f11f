"""Test-only worker module: the worker stops itself (SIGSTOP) the instant it receives its
first ``delivery.deliver`` task, before its lease keeper hears of it.

Loaded with ``celery -A tasks worker --include tests.freeze_on_receipt`` by
``tests/recovery.py``'s ``killed_right_after_receipt``: the test then SIGKILLs the stopped
worker, which is the crash the keeper cannot cover (a task received in the last instant before
the kill, never renewed by its worker). Its ``task_received`` receiver is connected ahead of
the keeper's (``tasks.leases``), so the keeper is never told: deterministic, no timing.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from celery.signals import task_received

from delivery.worker import leases

__all__: list[str] = []

_frozen = False


def _freeze(request: Any = None, **_: Any) -> None:
    global _frozen
    delivers = (leases.DELIVER, getattr(leases, "DELIVER_BATCH", leases.DELIVER))
    if _frozen or getattr(request, "name", None) not in delivers:
        return
    _frozen = True
    os.kill(os.getpid(), signal.SIGSTOP)


# Ahead of the keeper: receivers are called in the order they were connected. (A keeper that
# does not listen to receipts, as before issue 12's second round, has nothing to reorder.)
_keeper_hook = getattr(leases, "_task_received", None)
if _keeper_hook is not None:
    task_received.disconnect(_keeper_hook)
task_received.connect(_freeze, weak=False)
if _keeper_hook is not None:
    task_received.connect(_keeper_hook, weak=False)
