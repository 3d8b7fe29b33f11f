"""Signed webhooks (kind ``webhook``), in the shape of the Standard Webhooks spec.

Each message is ``POST``-ed as JSON (its ``payload``, compact) to its own URL (the message's
``to``, checked at ``enqueue``: http or https, no credentials in it), with three headers:

- ``webhook-id``: the message's idempotency key, the same on every attempt: receivers dedupe
  on it, which is why the default unknown policy is ``retry``;
- ``webhook-timestamp``: unix seconds of this attempt;
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, one per
  secret, space-separated.

Secrets come from the environment variable named by ``secret_env``. A secret ``whsec_<base64>``
is the spec's form (the key is the decoded bytes); any other value is used as UTF-8 bytes.
Several secrets separated by spaces sign with each (rotation: receivers accept any).

Outcomes (``classify``):

| answer | outcome |
|---|---|
| 2xx | ``Delivered(None)``: receivers give no reference |
| any non-2xx with ``Webhook-Stop-Retries: true`` | ``Permanent`` ``RECEIVER_STOPPED`` |
| 410 Gone | ``Permanent`` ``GONE``: the endpoint is dead |
| 408, 425, 429, 5xx (not 501) | ``Retryable``, ``Retry-After`` honoured |
| 3xx (not followed), other 4xx, 501 | ``Permanent`` ``HTTP_<status>`` |

Receivers cannot be asked whether they got a message: ``lookup`` answers ``LookupFailed``.

Configuration::

    [providers.hooks]
    kind = "webhook"
    secret_env = "WEBHOOK_SECRET"       # e.g. whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable, Mapping

import httpx

from delivery.config.settings import ProviderConfig
from delivery.errors import ConfigError
from delivery.pipeline import outcomes
from delivery.pipeline.policies import UnknownPolicy
from delivery.providers.base import Envelope
from delivery.providers.client import PooledClient

__all__ = ["STOP_HEADER", "WebhookProvider", "classify", "decode_secrets", "sign"]

STOP_HEADER = "Webhook-Stop-Retries"
_RETRY_STATUS = frozenset({408, 425, 429})


def decode_secrets(value: str) -> list[bytes]:
    """The signing keys in ``value`` (space-separated; ``whsec_`` means base64)."""
    keys = []
    for secret in value.split():
        if secret.startswith("whsec_"):
            try:
                keys.append(base64.b64decode(secret.removeprefix("whsec_"), validate=True))
            except binascii.Error:
                raise ValueError("a whsec_ secret must be base64 after the prefix") from None
        else:
            keys.append(secret.encode())
    return keys


def sign(keys: list[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one request."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for key in keys
    )


class WebhookProvider(PooledClient):
    """POSTs signed JSON to each message's own URL; see the module docstring."""

    config_keys: Mapping[str, type] = {"secret_env": str}
    default_on_unknown = UnknownPolicy.RETRY
    supports_lookup = False
    default_base_url = ""  # not used: each message carries its URL

    @classmethod
    def check_config(cls, config: ProviderConfig) -> None:
        if "secret_env" not in config.options:
            raise ConfigError("secret_env", "is required for kind 'webhook' (signing secret)")

    def __init__(
        self,
        config: ProviderConfig,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self._secret_env = str(config.options["secret_env"])
        self._clock = clock
        self._problem: str | None = None
        self._keys: list[bytes] = []
        try:
            self._keys = decode_secrets(os.environ.get(self._secret_env, ""))
        except ValueError as exc:
            self._problem = f"environment variable {self._secret_env}: {exc}"
        if not self._keys and self._problem is None:
            self._problem = f"environment variable {self._secret_env} is unset or empty"
        super().__init__(config, transport, follow_redirects=False)

    def send(self, envelope: Envelope) -> outcomes.Outcome:
        if self._problem is not None:  # never send unsigned
            return outcomes.Permanent("NO_CREDENTIALS", self._problem)
        body = json.dumps(
            envelope.payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
        timestamp = int(self._clock())
        headers = {
            "Content-Type": "application/json",
            "webhook-id": envelope.key,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self._keys, envelope.key, timestamp, body),
        }
        return self._post(classify, envelope.to, content=body, headers=headers)

    def lookup(self, envelope: Envelope) -> outcomes.LookupOutcome:
        return outcomes.LookupFailed("NO_LOOKUP", "a webhook receiver cannot be asked; use 'retry'")


def classify(response: httpx.Response) -> outcomes.Outcome:
    """Map a receiver's answer to an outcome (the table in the module docstring)."""
    status = response.status_code
    if 200 <= status < 300:
        return outcomes.Delivered(None, status)
    text = response.text[:200].strip() if response.content else ""
    reason = f"HTTP {status} {response.reason_phrase}" + (f": {text}" if text else "")
    if response.headers.get(STOP_HEADER, "").strip().lower() in ("true", "1"):
        return outcomes.Permanent(
            "RECEIVER_STOPPED", f"receiver sent {STOP_HEADER}; {reason}", status
        )
    if status == 410:
        return outcomes.Permanent("GONE", reason, status)
    if status in _RETRY_STATUS or (status >= 500 and status != 501):
        return outcomes.Retryable(
            f"HTTP_{status}",
            reason,
            status,
            outcomes.parse_retry_after(response.headers.get("retry-after")),
        )
    return outcomes.Permanent(f"HTTP_{status}", reason, status)
