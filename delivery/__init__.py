"""delivery: a transactional outbox for SMS, email and webhooks.

Write a message in your own transaction with ``enqueue``; the Celery service in ``delivery.worker``
sends it so that it takes effect once, is never lost, and can be repaired by ops.

The names below are the public API. The rooms behind them, each package's docstring saying what
lives there and what it may import: ``core`` (the shared vocabulary: schema, states, outcomes),
``transitions`` (the one writer of a message's status), ``outbox`` (``enqueue``), ``relay``
(what beat runs), ``sending`` (what a worker's task does), ``guards`` (circuit breaker, rate
limit), ``providers`` (the adapters), ``ops`` (inspect, repair, prune), ``observability``
(events, metrics), ``cli``, ``testing`` (the stub provider, the demo), ``config`` (settings),
``runtime`` (this process's wiring), ``console``, ``contrib`` (Flask, Django) and ``worker``
(the Celery app). Nothing here imports Celery.
"""

from __future__ import annotations

from delivery.config.loading import load_settings
from delivery.config.settings import Settings
from delivery.core.models import Attempt, Message
from delivery.core.policies import UnknownPolicy
from delivery.core.status import Status
from delivery.errors import (
    ConfigError,
    DeliveryError,
    IdempotencyConflict,
    InvalidMessage,
    MessageNotFound,
)
from delivery.observability.events import (
    Outcome,
    Transition,
    add_hook,
    add_outcome_hook,
    remove_outcome_hook,
)
from delivery.outbox.bulk import Enqueued, enqueue_many
from delivery.outbox.enqueue import EnqueueArgs, enqueue
from delivery.outbox.keys import agent_key, key
from delivery.runtime.current import configure, get_settings

__all__ = [
    "Attempt",
    "ConfigError",
    "DeliveryError",
    "EnqueueArgs",
    "Enqueued",
    "IdempotencyConflict",
    "InvalidMessage",
    "Message",
    "MessageNotFound",
    "Outcome",
    "Settings",
    "Status",
    "Transition",
    "UnknownPolicy",
    "add_hook",
    "add_outcome_hook",
    "agent_key",
    "configure",
    "enqueue",
    "enqueue_many",
    "get_settings",
    "key",
    "load_settings",
    "remove_outcome_hook",
]
