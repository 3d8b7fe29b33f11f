"""What every receipt protocol shares: the refusal of a bad signature, and the check of a
required text field (an ``InvalidReceipt`` naming it)."""

from __future__ import annotations

from delivery.core import bounds
from delivery.errors import InvalidReceipt

__all__ = ["KEY_LENGTH", "SignatureRefused", "text_field"]

KEY_LENGTH = 255  # delivery_messages.key


class SignatureRefused(Exception):
    """The receipt's signature is missing, wrong or too old; nothing was read."""


def text_field(value: object, field: str, limit: int) -> str:
    """A required text field of a receipt, printable and at most ``limit`` characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidReceipt(field, "is missing or not a string")
    if len(value) > limit or bounds.printable(value) != value:
        raise InvalidReceipt(field, f"is longer than {limit} characters or not printable")
    return value
