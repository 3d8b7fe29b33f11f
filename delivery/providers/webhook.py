"""Signed webhooks (kind ``webhook``), in the shape of the Standard Webhooks spec.

Each message is ``POST``-ed as JSON (its ``payload``, compact) to its own URL (the message's
``to``, checked at ``enqueue``: http or https, no credentials in it), with three headers:

- ``webhook-id``: the message's idempotency key, the same on every attempt: receivers dedupe
  on it, which is why the default unknown policy is ``retry``;
- ``webhook-timestamp``: unix seconds of this attempt;
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, one per
  secret, space-separated.

The configuration, the secrets (``secret_env``: ``whsec_`` + base64, several for rotation;
checked when settings load; none: ``NO_CREDENTIALS``, nothing goes out unsigned) and where a
webhook may connect (``delivery.providers.egress``): docs/providers.md, "Webhooks: signatures
and where they may go".

Outcomes (``classify``):

| answer | outcome |
|---|---|
| address refused by the guard (no connection made) | ``Permanent`` ``WEBHOOK_ADDRESS_BLOCKED`` |
| 2xx | ``Delivered(None)``: receivers give no reference |
| any non-2xx with ``Webhook-Stop-Retries: true`` | ``Permanent`` ``RECEIVER_STOPPED`` |
| 410 Gone | ``Permanent`` ``GONE``: the endpoint is dead |
| 408, 425, 429, 5xx (not 501) | ``Retryable``, ``Retry-After`` honoured |
| 3xx (not followed), other 4xx, 501 | ``Permanent`` ``HTTP_<status>`` |

Receivers cannot be asked whether they got a message: ``lookup`` answers ``LookupFailed``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from urllib.parse import urlsplit

import httpx
from standardwebhooks.webhooks import Webhook

from delivery.config.settings import ProviderConfig
from delivery.core import outcomes
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError, InvalidMessage
from delivery.providers.base import Envelope
from delivery.providers.client import PooledClient
from delivery.providers.egress import Egress, GuardError, blocked, scrub

__all__ = [
    "MIN_SECRET_BYTES",
    "STOP_HEADER",
    "WebhookProvider",
    "classify",
    "decode_secrets",
    "sign",
]

STOP_HEADER = "Webhook-Stop-Retries"
_RETRY_STATUS = frozenset({408, 425, 429})
MIN_SECRET_BYTES = 24
SECRET_PREFIX = "whsec_"


def decode_secrets(value: str) -> list[bytes]:
    """The signing keys in ``value``: space-separated ``whsec_<base64>`` secrets (unpadded
    base64 accepted), each at least ``MIN_SECRET_BYTES`` long; ``ValueError`` otherwise."""
    keys = []
    for n, secret in enumerate(value.split(), start=1):
        if not secret.startswith(SECRET_PREFIX):
            raise ValueError(f"secret {n} must start with {SECRET_PREFIX!r} (Standard Webhooks)")
        text = secret.removeprefix(SECRET_PREFIX)
        try:
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except binascii.Error:
            raise ValueError(f"secret {n} must be base64 after {SECRET_PREFIX!r}") from None
        if len(key) < MIN_SECRET_BYTES:
            raise ValueError(
                f"secret {n} is {len(key)} bytes; Standard Webhooks wants at least "
                f"{MIN_SECRET_BYTES} random bytes"
            )
        keys.append(key)
    if not keys:
        raise ValueError("is empty")
    return keys


def sign(keys: list[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one request: one signature per key, each
    made by the ``standardwebhooks`` library."""
    at = dt.datetime.fromtimestamp(timestamp, dt.UTC)
    return " ".join(Webhook(key).sign(msg_id, at, body) for key in keys)


class WebhookProvider(PooledClient):
    """POSTs signed JSON to each message's own URL; see the module docstring."""

    config_keys: Mapping[str, type] = {
        "secret_env": str,
        "allow_hosts": list,
        "allow_networks": list,
        "https_only": bool,
    }
    default_on_unknown = UnknownPolicy.RETRY
    supports_lookup = False
    default_base_url = ""  # not used: each message carries its URL

    @classmethod
    def check_config(cls, config: ProviderConfig) -> None:
        if "secret_env" not in config.options:
            raise ConfigError("secret_env", "is required for kind 'webhook' (signing secret)")
        Egress.from_options(config.options)
        name = str(config.options["secret_env"])
        value = os.environ.get(name)
        if value is not None:  # a process that only enqueues need not hold the secret
            try:
                decode_secrets(value)
            except ValueError as exc:
                raise ConfigError("secret_env", f"environment variable {name}: {exc}") from None

    @classmethod
    def check_recipient(cls, config: ProviderConfig, to: str) -> None:
        """Refuse at ``enqueue`` a URL that can never be sent to (see ``Egress.refusal``)."""
        problem = Egress.from_options(config.options).refusal(to)
        if problem is not None:
            raise InvalidMessage("to", problem)

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
            self._problem = (
                f"providers.{config.name}.secret_env: environment variable {self._secret_env} "
                f"{'is unset' if self._secret_env not in os.environ else exc}"
            )
        if transport is None:
            transport = Egress.from_options(config.options).transport()
        super().__init__(config, transport)

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
        host = urlsplit(envelope.to).hostname or ""
        try:
            outcome = self._post(classify, envelope.to, content=body, headers=headers)
        except GuardError as exc:  # refused before any connection was made
            return blocked(exc, host)
        if (
            isinstance(outcome, outcomes.Retryable | outcomes.Unknown)
            and outcome.http_status is None
        ):
            return replace(outcome, reason=scrub(outcome.reason, host))  # a network error
        return outcome

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
    code = f"HTTP_{status}"
    if status in _RETRY_STATUS or (status >= 500 and status != 501):
        return outcomes.Retryable(
            code,
            reason,
            status,
            outcomes.parse_retry_after(response.headers.get("retry-after")),
            created_nothing=status == 429,  # rate limited before the request was handled
        )
    return outcomes.Permanent(code, reason, status)
