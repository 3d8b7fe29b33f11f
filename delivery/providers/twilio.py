"""Twilio-style SMS (kind ``twilio``): Programmable Messaging, API version 2010-04-01.

Wire contract (Twilio's OpenAPI description, ``CreateMessage`` and ``ListMessage``; the
parameters used here are checked against it in ``tests/test_providers_twilio.py``):

- ``POST {base}/2010-04-01/Accounts/{account_sid}/Messages.json``, form-encoded ``To``,
  ``From`` (or ``MessagingServiceSid``) and ``Body``, HTTP basic auth ``account_sid`` and the
  auth token. 201 with the message resource; its ``sid`` (``SM...``) is the provider reference.
- Errors: JSON ``{"code": 21211, "message": ..., "more_info": ..., "status": 400}``.
- With ``status_callback_url``: ``StatusCallback`` ``{status_callback_url}?key={key}``, where
  Twilio reports each status change (``delivery.receipts.twilio``).
- ``GET`` on the same path lists messages filtered by ``To`` and ``From``, in pages
  (``PageSize`` up to 1000, ``next_page_uri``). Twilio sorts the list by the send date, and a
  message not sent yet (``accepted``, ``scheduled``, ``queued``) has none, so the list has no
  creation-time order to rely on.

**Send outcomes** (``classify``), for the codes the create call answers synchronously:

=====================  ==========  =====================================================
answer                 outcome     why
=====================  ==========  =====================================================
2xx with a ``sid``     Delivered   Twilio accepted it; delivery itself is reported later
2xx without a ``sid``  Unknown     it may exist: the message's ``on_unknown`` policy
``RETRYABLE_CODES``    Retryable   20429 too many requests, 21611 the sender's queue full
``PERMANENT_CODES``    Permanent   e.g. 20003 auth, 21211 invalid To, 21610 unsubscribed
500, 502, 504          Unknown     written, Twilio may have created it (``WRITTEN_STATUS``)
408, 429, 503, 5xx     Retryable   ``Retry-After`` honoured (501 is Permanent)
other 4xx              Permanent   the code is kept (``delivery dead --code 21999``)
=====================  ==========  =====================================================

Delivery errors (``30xxx``) are never answered by the create call: Twilio reports them
later, on the message (``status`` ``failed`` or ``undelivered`` with ``error_code``). Only a
lookup sees them (below). 21214 is a voice code and is not in the table.

**Unknown outcomes: the lookup.** This API takes no idempotency key: a resend after an
unknown outcome is a second SMS. The default policy of a channel on this kind is therefore
``lookup``: before sending again, the adapter lists the recipient's messages (``To``, and
``From`` when ``from_number`` is set) and keeps those whose body is ours (equal, or ending
with ours: trial accounts prefix bodies) and whose ``date_created`` is inside
``lookup_window`` (a message without one counts as inside). It reads the whole list, in any
order, up to ``lookup_pages`` pages of 100, then judges every match (``judge``):

=========================================  ==============  ===================================
matches                                    lookup outcome  the sender then
=========================================  ==============  ===================================
one is accepted, scheduled, queued,        Found           marks it ``sent`` (its sid)
sending, sent, delivered, read or
partially_delivered
one has a status not in Twilio's list      LookupFailed    looks again later; ``unknown`` for
                                                           review when attempts run out
one failed/undelivered with a code in      Undeliverable   ``dead`` with that code, no resend
``UNDELIVERABLE_CODES``, or a code not in
either table
one canceled (at Twilio, by the account)   Undeliverable   ``dead`` code ``CANCELED``: redrive
                                                           to send it anyway
only failed/undelivered with a code in     Absent          sends again (after the backoff
``RESEND_CODES``, or no code                               that preceded the lookup)
none (or only inbound ones)                Absent          sends again
=========================================  ==============  ===================================

The rows are tried top to bottom: a message that reached the user wins over an earlier one
that did not. **Budget:** when the list has more than ``lookup_pages`` pages, Found is still
Found (what was read is enough), but nothing else can be concluded from part of the list:
the lookup fails with ``LOOKUP_BUDGET`` and is tried again later; when the message's attempts
run out it ends ``unknown`` for review. It is never taken for absent, so a long list costs a
review, never a duplicate.

Its other limits:

- It matches on recipient, sender, body and time, not on our key. An earlier message with
  the same body to the same number inside the window is taken for ours, and ours is then
  marked sent without being sent: a miss, never a duplicate. Bodies that repeat verbatim
  (fixed texts) should use ``on_unknown = "give_up"`` or carry something unique; an OTP does.
- The ``DateSent>=`` filter is deliberately not used: a message still queued has no
  ``date_sent`` and would be missed, which would cause exactly the duplicate we look for.
- A message Twilio accepted but does not list yet (its list can lag its create by a moment)
  reads as absent and is sent again. The backoff before the lookup is the only guard.
- A resend after a transient delivery error (30003 handset off) is accepted by the create
  call and recorded ``sent``; if it fails again, only Twilio's message log says so.

A ``StatusCallback`` URL carrying our key was considered and not used: the message resource
does not return its callback URL, so a list query cannot match on it, and it needs a public
receiver of Twilio's callbacks.

Configuration (checked at start-up: the SIDs are ``AC`` or ``MG`` and 32 hex characters)::

    [providers.twilio]
    kind = "twilio"
    base_url = "https://api.twilio.com"    # the default
    account_sid = "AC..."
    auth_token_env = "TWILIO_AUTH_TOKEN"   # the variable holding the auth token
    from_number = "+15005550006"           # or messaging_service_sid = "MG..."
    lookup_window = 86400                  # seconds a lookup looks back (default: one day)
    lookup_pages = 5                       # pages of 100 a lookup reads at most
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from delivery.config.settings import ProviderConfig
from delivery.core.outcomes import (
    Found,
    LookupFailed,
    LookupOutcome,
    Outcome,
    Permanent,
    classify_exception,
)
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError
from delivery.providers.base import Envelope
from delivery.providers.client import PooledClient, parse_json
from delivery.providers.twilio_contract import (
    DELIVERED_STATUSES,
    PERMANENT_CODES,
    RESEND_CODES,
    RETRYABLE_CODES,
    UNDELIVERABLE_CODES,
    classify,
    judge,
    matches_ours,
    parse_date,
)

__all__ = [
    "DELIVERED_STATUSES",
    "PERMANENT_CODES",
    "RESEND_CODES",
    "RETRYABLE_CODES",
    "UNDELIVERABLE_CODES",
    "TwilioProvider",
    "classify",
    "judge",
]

API_VERSION = "2010-04-01"
PAGE_SIZE = 100
#: A page of 100 message resources is some 100-200 KB: the body limit of a list query.
LIST_LIMIT = 1024 * 1024
SIDS = {
    "account_sid": re.compile(r"AC[0-9a-fA-F]{32}"),
    "messaging_service_sid": re.compile(r"MG[0-9a-fA-F]{32}"),
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
        "status_callback_url": str,
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
        for name, pattern in SIDS.items():
            value = options.get(name)
            if value is not None and not pattern.fullmatch(str(value)):
                raise ConfigError(
                    name,
                    f"is not a Twilio SID: {pattern.pattern[:2]} and 32 hex characters expected "
                    f"(got {len(str(value))} characters starting {str(value)[:2]!r})",
                )
        callback = options.get("status_callback_url")
        if callback is not None and not re.fullmatch(r"https?://[^\s?#]+", str(callback)):
            raise ConfigError(
                "status_callback_url", "is not an http(s) URL without a query or fragment"
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
        callback = options.get("status_callback_url")
        self._callback = None if callback is None else str(callback)
        self._window = dt.timedelta(seconds=float(options.get("lookup_window", 86400.0)))
        self._pages = int(options.get("lookup_pages", 5))
        super().__init__(
            config, transport, base_url=config.base_url, headers={"Accept": "application/json"}
        )
        self._client.auth = httpx.BasicAuth(sid, token or "")

    def send(self, envelope: Envelope) -> Outcome:
        if not self._has_token:
            return Permanent("NO_CREDENTIALS", f"environment variable {self._token_env} is unset")
        body = envelope.payload.get("body")
        if not isinstance(body, str) or not body:
            return Permanent("PAYLOAD_INVALID", "a Twilio SMS needs a non-empty 'body'")
        form = {"To": envelope.to, **self._sender, "Body": body}
        if self._callback is not None:  # receipts: delivery.receipts.twilio
            form["StatusCallback"] = f"{self._callback}?{urlencode({'key': envelope.key})}"
        return self._post(classify, self._path, data=form)

    def lookup(self, envelope: Envelope) -> LookupOutcome:
        """Find ours by recipient, sender, body and time; judge it (the module docstring)."""
        if not self._has_token:
            return LookupFailed(
                "NO_CREDENTIALS", f"environment variable {self._token_env} is unset"
            )
        body = str(envelope.payload.get("body", ""))
        since = dt.datetime.now(dt.UTC) - self._window
        params: dict[str, str | int] = {"To": envelope.to, "PageSize": PAGE_SIZE}
        if "From" in self._sender:
            params["From"] = self._sender["From"]
        url: str = self._path
        query: dict[str, str | int] | None = params
        matches: list[Mapping[str, Any]] = []
        status = 200
        for _ in range(self._pages):
            try:
                response = self._exchange("GET", url, limit=LIST_LIMIT, params=query)
            except httpx.HTTPError as exc:
                return LookupFailed(classify_exception(exc).code, str(exc)[:500])
            page = parse_json(response)
            status = response.status_code
            if status != 200 or not isinstance(page, dict):
                outcome = classify(response)
                code = getattr(outcome, "code", f"HTTP_{status}")
                return LookupFailed(code, f"list query: {getattr(outcome, 'reason', '')}", status)
            for message in page.get("messages") or []:
                if not isinstance(message, dict) or not matches_ours(message, envelope.to, body):
                    continue
                created = parse_date(message.get("date_created"))
                if created is None or created >= since:  # the list is in no creation order
                    matches.append(message)
            next_uri = page.get("next_page_uri")
            if not next_uri:
                return judge(matches, complete=True, http_status=status)
            url, query = str(next_uri), None
        verdict = judge(matches, complete=False, http_status=status)
        if isinstance(verdict, Found):
            return verdict
        return LookupFailed(
            "LOOKUP_BUDGET",
            f"read {self._pages} pages of messages to this number without finding ours; "
            "the rest of the list was not read",
            status,
        )
