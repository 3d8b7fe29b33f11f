"""Pigeon-style email (kind ``pigeon``): an email API that talks to SMTP inside the request.

Wire contract:

- ``POST {base}/api/send-email`` with ``Authorization: Bearer <key>`` and ``Idempotency-Key``,
  JSON ``{"to", "subject", "templateId", "templateData"?, "replyTo"?}``. A 2xx answers
  ``{"emailId": 123}``, the provider reference. Same key again: no second email, the same
  ``emailId``. Errors: JSON ``{"error": ..., "code": ...}``, except a 503 from the proxy during
  a deploy, whose body is HTML.
- Pigeon talks to the SMTP server inside the request and gives up after some 40 seconds,
  so the attempt's read timeout defaults to 45 s (``default_timeouts``), above that budget;
  ``[providers.NAME.timeouts] read`` wins. Below 40 s, sends that would work end unknown.

Outcomes (``classify``), as pigeon's reference client decides: 429, 503 and 504 are
``Retryable`` (``Retry-After`` honoured); 502 only with code ``SMTP_DELIVERY_FAILED`` and 409
only with ``IDEMPOTENCY_IN_PROGRESS`` (our own earlier attempt is still talking to the SMTP
server: the worker waits out the SMTP budget, ``in_progress_wait``, without spending an
attempt, so this never ends ``dead``); everything else is final (``Permanent``, e.g. 401,
``SMTP_DELIVERY_REJECTED``).

Payload: the message's ``payload`` fields go out as they are, plus ``to``; our ``template``
field (an email needs one) may be ``{"id": 7, "data": {...}}``, sent as ``templateId`` and
``templateData``, or a template id alone.

Unknown outcomes: pigeon documents no way to look a send up, so ``lookup`` answers
``LookupFailed("NO_LOOKUP")`` and a channel on this kind may not set ``on_unknown = "lookup"``.
The right policy is ``retry`` (the default): the same key makes pigeon return the first
send's ``emailId`` instead of sending again.

Configuration::

    [providers.pigeon]
    kind = "pigeon"
    base_url = "https://pigeon.example.com"
    api_key_env = "PIGEON_API_KEY"
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from delivery.config.settings import ProviderConfig
from delivery.core import outcomes
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError
from delivery.providers.base import Envelope
from delivery.providers.client import PooledClient, parse_json

__all__ = ["SMTP_BUDGET", "PigeonProvider", "classify"]

log = logging.getLogger("delivery.providers.pigeon")
SMTP_BUDGET = 40.0  # seconds pigeon spends on a slow SMTP server before it gives up
_RETRY_STATUS = frozenset({429, 503, 504})


class PigeonProvider(PooledClient):
    """Sends email through a pigeon-compatible ``/api/send-email``; see the module docstring."""

    default_on_unknown = UnknownPolicy.RETRY
    supports_lookup = False
    default_timeouts = {"read": SMTP_BUDGET + 5.0}
    #: A 409 IDEMPOTENCY_IN_PROGRESS without Retry-After: our earlier send is still talking to
    #: the SMTP server; wait out pigeon's budget before asking again (no attempt spent).
    in_progress_wait = SMTP_BUDGET + 5.0

    @classmethod
    def check_config(cls, config: ProviderConfig) -> None:
        if config.api_key_env is None:
            raise ConfigError("api_key_env", "is required for kind 'pigeon' (bearer key)")

    def __init__(self, config: ProviderConfig, transport: httpx.BaseTransport | None = None):
        self._key_env = config.api_key_env
        key = config.api_key()
        self._has_key = bool(key)
        if config.timeouts.read <= SMTP_BUDGET:
            log.warning(
                "provider %s: read timeout %.1f s is not above pigeon's %.0f s SMTP budget; "
                "slow sends that would work will end unknown",
                config.name,
                config.timeouts.read,
                SMTP_BUDGET,
            )
        super().__init__(
            config,
            transport,
            base_url=config.base_url,
            headers={"Authorization": f"Bearer {key or ''}"},
        )

    def send(self, envelope: Envelope) -> outcomes.Outcome:
        if not self._has_key:
            return outcomes.Permanent(
                "NO_CREDENTIALS", f"environment variable {self._key_env} is unset"
            )
        headers = {"Idempotency-Key": envelope.key}
        return self._post(classify, "/api/send-email", json=_body(envelope), headers=headers)

    def lookup(self, envelope: Envelope) -> outcomes.LookupOutcome:
        return outcomes.LookupFailed("NO_LOOKUP", "pigeon has no lookup; use on_unknown = 'retry'")


def classify(response: httpx.Response) -> outcomes.Outcome:
    """Map one answer of ``/api/send-email`` to an outcome (the module docstring's rules)."""
    status = response.status_code
    body = parse_json(response)  # None for the HTML page of a 503 during a deploy
    fields = body if isinstance(body, dict) else {}
    if 200 <= status < 300:
        email_id = fields.get("emailId")
        if email_id is not None and email_id != "":
            return outcomes.Delivered(str(email_id), status)
        return outcomes.Unknown("NO_PROVIDER_REF", f"HTTP {status} without an emailId", status)
    code = str(fields.get("code") or f"HTTP_{status}")
    if fields.get("error"):
        reason = str(fields["error"])[:500]
    else:
        kind = "" if body is not None or not response.content else " (non-JSON body)"
        reason = f"HTTP {status} {response.reason_phrase}{kind}".strip()
    retry = (
        status in _RETRY_STATUS
        or (status == 502 and code == "SMTP_DELIVERY_FAILED")
        or (status == 409 and code == "IDEMPOTENCY_IN_PROGRESS")
    )
    if retry:
        return outcomes.Retryable(
            code,
            reason,
            status,
            outcomes.parse_retry_after(response.headers.get("retry-after")),
            created_nothing=status == 429,  # rate limited before the send
        )
    return outcomes.Permanent(code, reason, status)


def _body(envelope: Envelope) -> dict[str, Any]:
    body = {k: v for k, v in envelope.payload.items() if k != "template"}
    template = envelope.payload.get("template")
    if isinstance(template, dict):
        if "id" in template:
            body.setdefault("templateId", template["id"])
        if "data" in template:
            body.setdefault("templateData", template["data"])
    elif template is not None:
        body.setdefault(
            "templateId",
            int(template) if isinstance(template, str) and template.isdigit() else template,
        )
    body["to"] = envelope.to
    return body
