"""delivery: a transactional outbox for SMS, email and webhooks.

Write a message in your own transaction with ``enqueue``; the Celery service in ``tasks``
sends it so that it takes effect once, is never lost, and can be repaired by ops.
"""

from __future__ import annotations

from delivery.config import Settings, load_settings
from delivery.errors import (
    ConfigError,
    DeliveryError,
    IdempotencyConflict,
    InvalidMessage,
    MessageNotFound,
)
from delivery.events import Transition, add_hook
from delivery.keys import agent_key, key
from delivery.models import Attempt, Message
from delivery.outbox import enqueue
from delivery.policies import UnknownPolicy
from delivery.runtime import configure, get_settings
from delivery.status import Status

__all__ = [
    "Attempt",
    "ConfigError",
    "DeliveryError",
    "IdempotencyConflict",
    "InvalidMessage",
    "Message",
    "MessageNotFound",
    "Settings",
    "Status",
    "Transition",
    "UnknownPolicy",
    "add_hook",
    "agent_key",
    "configure",
    "enqueue",
    "get_settings",
    "key",
    "load_settings",
]
