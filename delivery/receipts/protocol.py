"""The reference protocol's receipts (kind ``http``; docs/providers.md, "Delivery receipts").

For each status change of a message it accepted, the provider POSTs the JSON object
``{"id", "idempotency_key", "status", "code", "at"}`` signed the way Standard Webhooks sign
(``webhook-id``, ``webhook-timestamp``, ``webhook-signature``: HMAC-SHA256 keyed with the
provider's ``whsec_`` secret). The signature and its timestamp (five minutes either way, so an
old callback cannot be replayed) are checked by the ``standardwebhooks`` library; the
``webhook-id`` is the event's id, the same on every retry of one callback. Every field is
checked and bounded before anything is stored: a bad one is an ``InvalidReceipt`` naming it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from delivery.core import bounds
from delivery.errors import ConfigError, InvalidReceipt
from delivery.transitions.receipts import RECEIPT_STATUSES, ReceiptEvent

__all__ = ["SignatureRefused", "Verifier", "read"]

_KEY_LENGTH = 255  # delivery_messages.key


class SignatureRefused(Exception):
    """The receipt's signature is missing, wrong or too old; nothing was read."""


class Verifier:
    """The signature check of one provider's receipts, with its ``whsec_`` secret."""

    def __init__(self, setting: str, secret: str) -> None:
        try:
            self._webhook = Webhook(secret)
        except Exception:  # a secret that is not base64 after its prefix, or empty
            raise ConfigError(setting, "is not a whsec_ secret (base64 after 'whsec_')") from None

    def check(self, body: bytes, headers: Mapping[str, str]) -> None:
        try:
            self._webhook.verify(body, dict(headers), json_parse=False)
        except WebhookVerificationError as exc:
            raise SignatureRefused(str(exc)) from None


def read(provider: str, body: bytes, headers: Mapping[str, str]) -> ReceiptEvent:
    """The receipt in ``body`` (its signature already checked), for ``provider``."""
    event = _text(headers.get("webhook-id"), "webhook-id", bounds.REF_LENGTH)
    try:
        data = json.loads(body)
    except ValueError:
        raise InvalidReceipt("body", "is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidReceipt("body", "is not a JSON object")
    status = data.get("status")
    if status not in RECEIPT_STATUSES:
        raise InvalidReceipt("status", f"is not one of {', '.join(RECEIPT_STATUSES)}")
    code = data.get("code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, str | int)):
        raise InvalidReceipt("code", "is not a string or null")
    return ReceiptEvent(
        provider=provider,
        event=event,
        key=_text(data.get("idempotency_key"), "idempotency_key", _KEY_LENGTH),
        status=status,
        code=None if code is None else bounds.code(code),
        at=_time(data.get("at")),
    )


def _text(value: object, field: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidReceipt(field, "is missing or not a string")
    if len(value) > limit or bounds.printable(value) != value:
        raise InvalidReceipt(field, f"is longer than {limit} characters or not printable")
    return value


def _time(value: object) -> dt.datetime | None:
    """``at``: ISO 8601 with a time zone, or absent."""
    if value is None:
        return None
    try:
        at = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidReceipt("at", "is not an ISO 8601 time with a time zone")
    return at.astimezone(dt.UTC)
