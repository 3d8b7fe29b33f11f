"""Exceptions raised by ``delivery``.

Exceptions are for bad input and bugs, never for the outcome of a send (see
``delivery.core.outcomes`` for that). The tree::

    DeliveryError
    ├── ConfigError            a setting is missing or wrong; names the key
    ├── InvalidMessage         bad input to ``enqueue``; names the field
    ├── IdempotencyConflict    key already used for a different payload
    ├── MessageNotFound        no message with that id or key (ops commands)
    ├── InvalidFilter          a bad search filter (console, ops); names the field
    └── InvalidReceipt         a provider's receipt is malformed; names the field
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DeliveryError",
    "IdempotencyConflict",
    "InvalidFilter",
    "InvalidMessage",
    "InvalidReceipt",
    "MessageNotFound",
]


class DeliveryError(Exception):
    """Base class of every exception this package raises on purpose."""


class ConfigError(DeliveryError):
    """A setting is missing or invalid. ``key`` is its dotted name (``providers.stub.kind``)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key}: {problem}")
        self.key = key
        self.problem = problem


class InvalidMessage(DeliveryError):
    """``enqueue`` was given bad input; nothing was written. ``field`` names the argument."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class IdempotencyConflict(DeliveryError):
    """The key is already bound to a different payload; nothing was written."""

    def __init__(self, key: str, existing_id: int) -> None:
        super().__init__(
            f"idempotency key {key!r} is already used by message {existing_id} "
            "with a different payload; use a new key for new content"
        )
        self.key = key
        self.existing_id = existing_id


class MessageNotFound(DeliveryError):
    """No message matches the given id or key."""

    def __init__(self, ref: str) -> None:
        super().__init__(f"no message with id or key {ref!r}")
        self.ref = ref


class InvalidFilter(DeliveryError):
    """A search filter is malformed (``status: 'sen' is not a status``); nothing was read.
    ``field`` names the filter."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidReceipt(DeliveryError):
    """A provider's receipt is malformed (``status: 'lost' is not a receipt status``); nothing
    was written. ``field`` names the field of the receipt."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem
