"""The Celery app: ``celery -A delivery.worker worker`` and ``celery -A delivery.worker beat``.

The one room of ``delivery`` that imports Celery; nothing else in the package imports it (the
framework integrations load this module by name, only for the post-commit nudge). Thin by
design: each task calls one function of ``delivery``. Settings come from the environment when
Celery first reads its configuration (``DELIVERY_*``, see ``delivery.config``).

- ``app``: the Celery application and its queues; ``deliver``: the task for one message;
  ``batch``: the task for a batch of messages; ``publish``: how the relay and the post-commit
  nudge publish those tasks (``apply_async``: Celery's publish signals and ``task_routes``
  apply); ``schedule``: the relay and sweeper loops that run in beat; ``leases``: the worker's
  lease keeper; ``metrics``: the worker's Prometheus hooks; ``filebroker``: the embedded
  default's file broker.

May import: any room of ``delivery``, Celery and kombu.
"""

from __future__ import annotations

from delivery.worker import leases as _leases  # noqa: F401  (the worker's lease keeper)
from delivery.worker import metrics as _metrics  # noqa: F401  (worker metrics hooks)
from delivery.worker.app import app
from delivery.worker.batch import deliver_batch
from delivery.worker.deliver import DeadLettered, deliver
from delivery.worker.publish import publish
from delivery.worker.schedule import relay, sweep

__all__ = ["DeadLettered", "app", "deliver", "deliver_batch", "publish", "relay", "sweep"]
