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
from delivery.providers.webhook import decode_secrets
from delivery.receipts.fields import KEY_LENGTH, SignatureRefused, text_field
from delivery.transitions.receipts import RECEIPT_STATUSES, ReceiptEvent

__all__ = ["StandardReceipts"]


class StandardReceipts:
    """One ``http`` provider's receipts: checked with its ``whsec_`` secret (``setting`` names
    where the secret came from, for the ``ConfigError`` of a bad one)."""

    #: The codes of an ``undelivered`` receipt that put its recipient on the suppression list.
    suppressing = frozenset(
        {"UNSUBSCRIBED", "UNREACHABLE", "INVALID_RECIPIENT", "LANDLINE", "HARD_BOUNCE", "COMPLAINT"}
    )

    def __init__(self, provider: str, setting: str, secret: str) -> None:
        self.provider = provider
        try:  # whsec_ secrets read as the webhook adapter reads its own (several: a rotation)
            self._webhooks = [Webhook(key) for key in decode_secrets(secret)]
        except ValueError as exc:
            raise ConfigError(setting, str(exc)) from None

    def read(self, body: bytes, headers: Mapping[str, str], query: str) -> ReceiptEvent:
        """The receipt in ``body`` once its signature holds for one of the secrets
        (``SignatureRefused`` if not); ``InvalidReceipt`` naming a bad field. ``query`` is not
        part of this protocol."""
        refusals = []
        for webhook in self._webhooks:
            try:
                webhook.verify(body, dict(headers), json_parse=False)
                break
            except WebhookVerificationError as exc:
                refusals.append(str(exc))
        else:
            raise SignatureRefused("; ".join(refusals))
        event = text_field(headers.get("webhook-id"), "webhook-id", bounds.REF_LENGTH)
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
            provider=self.provider,
            event=event,
            key=text_field(data.get("idempotency_key"), "idempotency_key", KEY_LENGTH),
            status=status,
            code=None if code is None else bounds.code(code),
            at=_time(data.get("at")),
        )


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
