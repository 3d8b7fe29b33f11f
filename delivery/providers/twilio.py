"""Twilio-style SMS (kind ``twilio``): Programmable Messaging, API version 2010-04-01.

Wire contract:

- ``POST {base}/2010-04-01/Accounts/{account_sid}/Messages.json``, form-encoded ``To``,
  ``From`` (or ``MessagingServiceSid``) and ``Body``, HTTP basic auth ``account_sid`` and the
  auth token. 201 with the message resource; its ``sid`` (``SM...``) is the provider reference.
- Errors: JSON ``{"code": 21211, "message": ..., "more_info": ..., "status": 400}``.
- ``GET`` on the same path lists messages, newest first, filtered by ``To`` and ``From``, in
  pages (``PageSize``, ``next_page_uri``).

Outcomes (``classify``): a code in ``PERMANENT_CODES`` is ``Permanent`` whatever the status; a
code in ``RETRYABLE_CODES`` is ``Retryable``; 500, 502 and 504 (``WRITTEN_STATUS``: the request
was written and Twilio may have created the message) are ``Unknown``, so the channel's policy
(``lookup`` by default) decides; 408, 429 and other 5xx (not 501) are ``Retryable`` (``Retry-After``
honoured); any other 4xx is ``Permanent``; 2xx with a ``sid`` is ``Delivered``. The error code
is recorded as the message's code (``delivery dead --code 21211``).

Configuration::

    [providers.twilio]
    kind = "twilio"
    base_url = "https://api.twilio.com"    # the default
    account_sid = "AC..."
    auth_token_env = "TWILIO_AUTH_TOKEN"   # the variable holding the auth token
    from_number = "+15005550006"           # or messaging_service_sid = "MG..."
    lookup_window = 86400                  # seconds a lookup looks back (default: one day)
    lookup_pages = 5                       # pages of 100 a lookup reads at most

**Unknown outcomes.** This API takes no idempotency key: a resend after an unknown outcome
is a second SMS. The default policy of a channel on this kind is therefore ``lookup``: before
sending again, the adapter lists the recipient's messages (``To``, and ``From`` when
``from_number`` is set), newest first, back to ``lookup_window`` by ``date_created``, and takes
the first one whose body is ours (equal, or ending with ours: trial accounts prefix bodies) as
ours. Its limits:

- It matches on recipient, sender, body and time, not on our key. An earlier message with
  the same body to the same number inside the window is taken for ours, and ours is then
  marked sent without being sent: a miss, never a duplicate. Bodies that repeat verbatim
  (fixed texts) should use ``on_unknown = "give_up"`` or carry something unique; an OTP does.
- The ``DateSent>=`` filter is deliberately not used: a message still queued has no
  ``date_sent`` and would be missed, which would cause exactly the duplicate we look for.
- A message Twilio accepted but does not list yet (its list can lag its create by a moment)
  reads as absent and is sent again. The backoff before the lookup is the only guard.
- More than ``lookup_pages`` pages inside the window is ``LookupFailed`` (looked again later).

A ``StatusCallback`` URL carrying our key was considered and not used: the message resource
does not return its callback URL, so a list query cannot match on it, and it needs a public
receiver of Twilio's callbacks.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from delivery.config.settings import ProviderConfig
from delivery.errors import ConfigError
from delivery.pipeline import outcomes
from delivery.pipeline.policies import UnknownPolicy
from delivery.providers.base import Envelope
from delivery.providers.client import PooledClient

__all__ = ["PERMANENT_CODES", "RETRYABLE_CODES", "WRITTEN_STATUS", "TwilioProvider", "classify"]

API_VERSION = "2010-04-01"
PAGE_SIZE = 100

# Twilio error codes that will fail the same way every time (twilio.com/docs/errors/NNNNN).
PERMANENT_CODES: Mapping[int, str] = {
    20003: "authentication failed (account sid or auth token)",
    20404: "resource not found (account sid)",
    21211: "invalid 'To' phone number",
    21212: "invalid 'From' phone number",
    21214: "'To' phone number cannot be reached",
    21408: "permission to send an SMS has not been enabled for the region",
    21602: "message body is required",
    21603: "'From' phone number is required",
    21604: "'To' phone number is required",
    21606: "the 'From' number is not a valid message-capable phone number",
    21608: "the 'To' number is not verified (trial account)",
    21610: "attempt to send to an unsubscribed recipient (STOP)",
    21612: "the 'To' number is not reachable via SMS from this 'From' number",
    21614: "'To' number is not a valid mobile number",
    21617: "the message body exceeds the 1600 character limit",
    # Delivery errors (normally reported on the message later, here if a compatible API
    # answers them at once). 30003 (handset switched off) and 30008 (unknown) are transient.
    30004: "message blocked (by the recipient or the carrier)",
    30005: "unknown destination handset",
    30006: "landline or unreachable carrier",
    30007: "message filtered by the carrier",
}
# Server errors after the request was written: Twilio may have created the message, so the
# outcome is unknown (the channel's policy decides; ``lookup`` by default). 503 is not here:
# it is answered before the request is acted on.
WRITTEN_STATUS = frozenset({500, 502, 504})
# Codes that ask us to come back, whatever the status says.
RETRYABLE_CODES: Mapping[int, str] = {
    20429: "too many requests",
    21611: "the 'From' number's queue is full",
}


class TwilioProvider(PooledClient):
    """Sends SMS through a Twilio-compatible Messages API; see the module docstring."""

    config_keys: Mapping[str, type] = {
        "account_sid": str,
        "auth_token_env": str,
        "from_number": str,
        "messaging_service_sid": str,
        "lookup_window": float,
        "lookup_pages": int,
    }
    default_on_unknown = UnknownPolicy.LOOKUP
    supports_lookup = True
    default_base_url = "https://api.twilio.com"

    @classmethod
    def check_config(cls, config: ProviderConfig) -> None:
        options = config.options
        for required in ("account_sid", "auth_token_env"):
            if required not in options:
                raise ConfigError(required, "is required for kind 'twilio'")
        senders = [k for k in ("from_number", "messaging_service_sid") if k in options]
        if len(senders) != 1:
            raise ConfigError(
                "from_number", "set exactly one of from_number and messaging_service_sid"
            )
        if options.get("lookup_window", 1.0) <= 0:
            raise ConfigError("lookup_window", "must be > 0")
        if options.get("lookup_pages", 1) < 1:
            raise ConfigError("lookup_pages", "must be >= 1")

    def __init__(self, config: ProviderConfig, transport: httpx.BaseTransport | None = None):
        options = config.options
        sid = str(options["account_sid"])
        self._token_env = str(options["auth_token_env"])
        token = os.environ.get(self._token_env)  # the secret stays out of settings and logs
        self._has_token = bool(token)
        self._path = f"/{API_VERSION}/Accounts/{quote(sid, safe='')}/Messages.json"
        self._sender = (
            {"From": str(options["from_number"])}
            if "from_number" in options
            else {"MessagingServiceSid": str(options["messaging_service_sid"])}
        )
        self._window = dt.timedelta(seconds=float(options.get("lookup_window", 86400.0)))
        self._pages = int(options.get("lookup_pages", 5))
        super().__init__(
            config,
            transport,
            base_url=config.base_url,
            auth=httpx.BasicAuth(sid, token or ""),
            headers={"Accept": "application/json"},
        )

    def send(self, envelope: Envelope) -> outcomes.Outcome:
        if not self._has_token:
            return outcomes.Permanent(
                "NO_CREDENTIALS", f"environment variable {self._token_env} is unset"
            )
        body = envelope.payload.get("body")
        if not isinstance(body, str) or not body:
            return outcomes.Permanent("PAYLOAD_INVALID", "a Twilio SMS needs a non-empty 'body'")
        form = {"To": envelope.to, **self._sender, "Body": body}
        return self._post(classify, self._path, data=form)

    def lookup(self, envelope: Envelope) -> outcomes.LookupOutcome:
        """Find our message by recipient, sender, body and time window (see the docstring)."""
        if not self._has_token:
            return outcomes.LookupFailed(
                "NO_CREDENTIALS", f"environment variable {self._token_env} is unset"
            )
        body = str(envelope.payload.get("body", ""))
        since = dt.datetime.now(dt.UTC) - self._window
        params: dict[str, str | int] = {"To": envelope.to, "PageSize": PAGE_SIZE}
        if "From" in self._sender:
            params["From"] = self._sender["From"]
        url: str = self._path
        query: dict[str, str | int] | None = params
        for _ in range(self._pages):
            try:
                response = self._client.get(url, params=query)
            except httpx.HTTPError as exc:
                return outcomes.LookupFailed(outcomes.classify_exception(exc).code, str(exc)[:500])
            page = _json(response)
            if response.status_code != 200 or not isinstance(page, dict):
                outcome = classify(response)
                code = getattr(outcome, "code", f"HTTP_{response.status_code}")
                return outcomes.LookupFailed(
                    code, f"list query: {getattr(outcome, 'reason', '')}", response.status_code
                )
            for message in page.get("messages") or []:
                created = _date(message.get("date_created"))
                if created is not None and created < since:
                    return outcomes.Absent(response.status_code)
                if _ours(message, envelope.to, body) and message.get("sid"):
                    return outcomes.Found(str(message["sid"]), response.status_code)
            next_uri = page.get("next_page_uri")
            if not next_uri:
                return outcomes.Absent(response.status_code)
            url, query = str(next_uri), None
        return outcomes.LookupFailed(
            "LOOKUP_TOO_MANY",
            f"more than {self._pages} pages of messages to this number inside the window",
        )


def classify(response: httpx.Response) -> outcomes.Outcome:
    """Map one answer of the Messages API to an outcome (the table in the module docstring)."""
    status = response.status_code
    body = _json(response)
    if 200 <= status < 300:
        sid = body.get("sid") if isinstance(body, dict) else None
        if sid:
            return outcomes.Delivered(str(sid), status)
        return outcomes.Unknown("NO_PROVIDER_REF", f"HTTP {status} without a message sid", status)
    raw = body.get("code") if isinstance(body, dict) else None
    code = int(raw) if isinstance(raw, int) or (isinstance(raw, str) and raw.isdigit()) else None
    name = str(code) if code is not None else f"HTTP_{status}"
    message = body.get("message") if isinstance(body, dict) else None
    reason = (
        str(message)[:500]
        if message
        else (PERMANENT_CODES.get(code or 0) or f"HTTP {status} {response.reason_phrase}")
    )
    if code in PERMANENT_CODES:
        return outcomes.Permanent(name, reason, status)
    if code not in RETRYABLE_CODES and status in WRITTEN_STATUS:
        # The request reached Twilio and it failed while acting on it: the SMS may exist.
        return outcomes.Unknown(name, reason, status)
    if code in RETRYABLE_CODES or status in (408, 429) or (status >= 500 and status != 501):
        return outcomes.Retryable(
            name, reason, status, outcomes.parse_retry_after(response.headers.get("retry-after"))
        )
    return outcomes.Permanent(name, reason, status)


def _ours(message: Mapping[str, Any], to: str, body: str) -> bool:
    text = message.get("body")
    return (
        message.get("to") == to
        and message.get("direction", "outbound-api") != "inbound"
        and isinstance(text, str)
        and bool(body)
        and (text == body or text.endswith(body))
    )


def _date(value: Any) -> dt.datetime | None:
    """Twilio's dates are RFC 2822 (``Thu, 24 Aug 2023 05:01:45 +0000``)."""
    if not isinstance(value, str):
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _json(response: httpx.Response) -> Any:
    try:
        return json.loads(response.content) if response.content else None
    except ValueError:
        return None
