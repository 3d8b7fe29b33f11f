"""The Celery app: ``celery -A tasks worker``, ``celery -A tasks beat``, ``celery -A tasks flower``.

Thin by design: each task calls one function of ``delivery``. Settings come from the
environment when Celery first reads its configuration (``DELIVERY_*``, see delivery.config.loading).
"""

from __future__ import annotations

from tasks import leases as _leases  # noqa: F401  (the worker's lease keeper)
from tasks import metrics as _metrics  # noqa: F401  (worker metrics hooks)
from tasks.app import app
from tasks.batch import deliver_batch
from tasks.deliver import DeadLettered, deliver, publish
from tasks.schedule import relay, sweep

__all__ = ["DeadLettered", "app", "deliver", "deliver_batch", "publish", "relay", "sweep"]
