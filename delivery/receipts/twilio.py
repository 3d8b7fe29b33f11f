"""Twilio's receipts (kind ``twilio``): its StatusCallback (docs/providers.md, "Delivery
receipts").

With ``status_callback_url`` set, the adapter asks Twilio to call back
``{status_callback_url}?key={the message's key}`` on each status change of the message. Twilio
POSTs a form (``MessageSid``, ``MessageStatus``, ``ErrorCode``, ...) signed in
``X-Twilio-Signature``: base64 of HMAC-SHA1, keyed with the auth token, over the URL it called
followed by every POST parameter's name and value, sorted by name. The URL checked is the
configured one with the query the request arrived with, never one rebuilt from the request's
``Host`` (a proxy may have rewritten it). The event is ``MessageSid:MessageStatus``: a retried
callback repeats it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import parse_qsl

from delivery.core import bounds
from delivery.errors import InvalidReceipt
from delivery.providers.twilio_contract import (
    CANCELED,
    DELIVERED_STATUSES,
    FAILED_STATUSES,
    SUPPRESSING_CODES,
)
from delivery.receipts.fields import KEY_LENGTH, SignatureRefused, text_field
from delivery.transitions.receipts import ReceiptEvent

__all__ = ["STATUSES", "TwilioReceipts", "signature"]

#: Twilio's message statuses (``twilio_contract``'s vocabulary) as receipt statuses: a failed,
#: undelivered or canceled message ends undelivered; delivered and read (WhatsApp) delivered;
#: any other status of a message Twilio has (queued, sending, ...) moves nothing.
STATUSES = {
    **dict.fromkeys(DELIVERED_STATUSES, "queued"),
    "sent": "sent",
    "delivered": "delivered",
    "read": "delivered",
    **dict.fromkeys(FAILED_STATUSES | {CANCELED}, "undelivered"),
}


def signature(auth_token: str, url: str, params: Mapping[str, str]) -> str:
    """Twilio's ``X-Twilio-Signature`` of a POST of ``params`` to ``url``."""
    signed = url + "".join(name + params[name] for name in sorted(params))
    digest = hmac.new(auth_token.encode(), signed.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


class TwilioReceipts:
    """One ``twilio`` provider's receipts, checked with its auth token against its
    ``status_callback_url``."""

    #: The ``ErrorCode`` of an ``undelivered`` receipt that puts its recipient on the
    #: suppression list (``twilio_contract.SUPPRESSING_CODES``).
    suppressing = frozenset(str(code) for code in SUPPRESSING_CODES)

    def __init__(self, provider: str, url: str, auth_token: str) -> None:
        self.provider, self._url, self._token = provider, url, auth_token

    def read(self, body: bytes, headers: Mapping[str, str], query: str) -> ReceiptEvent:
        """The receipt in the form ``body`` once its signature holds (``SignatureRefused``
        if not); ``InvalidReceipt`` naming a bad field."""
        try:
            params = dict(parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=False))
        except UnicodeDecodeError:
            raise SignatureRefused("the body is not a form") from None
        url = f"{self._url}?{query}" if query else self._url
        given = headers.get("x-twilio-signature", "")
        if not hmac.compare_digest(signature(self._token, url, params), given):
            raise SignatureRefused("X-Twilio-Signature does not match")
        status = STATUSES.get(params.get("MessageStatus", ""))
        if status is None:
            raise InvalidReceipt("MessageStatus", f"is not one of {', '.join(STATUSES)}")
        sid = text_field(params.get("MessageSid"), "MessageSid", bounds.REF_LENGTH - 16)
        keys = [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "key"]
        code = params.get("ErrorCode") or None
        return ReceiptEvent(
            provider=self.provider,
            event=f"{sid}:{params['MessageStatus']}",
            key=text_field(keys[0] if len(keys) == 1 else None, "key", KEY_LENGTH),
            status=status,
            code=None if code is None else bounds.code(code),
        )
