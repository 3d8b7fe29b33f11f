"""The reference HTTP provider (kind ``http``; docs/providers.md, "The reference
protocol and the stub provider"; the stub speaks it).

- ``POST {base}/v1/messages`` with JSON ``{"to": ..., **payload}`` and ``Idempotency-Key``.
- ``GET {base}/v1/messages?idempotency_key=K``: 200 with the message, or 404.
- ``Authorization: Bearer <secret>`` when ``api_key_env`` names an environment variable.
- Receipts: signed POSTs to ``delivery receiver`` (``delivery.receipts.protocol``), checked
  with the ``whsec_`` secret in the variable ``receipt_secret_env`` names.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from delivery.config.settings import ProviderConfig
from delivery.core import outcomes
from delivery.providers.base import Envelope
from delivery.providers.client import PooledClient

__all__ = ["HttpProvider"]


class HttpProvider(PooledClient):
    config_keys: Mapping[str, type] = {"receipt_secret_env": str}

    def __init__(self, config: ProviderConfig, transport: httpx.BaseTransport | None = None):
        secret = config.api_key()
        super().__init__(
            config,
            transport,
            base_url=config.base_url,
            headers={"Authorization": f"Bearer {secret}"} if secret else {},
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )

    def send(self, envelope: Envelope) -> outcomes.Outcome:
        body = {"to": envelope.to, **envelope.payload}
        headers = {"Idempotency-Key": envelope.key}
        return self._post(outcomes.classify_response, "/v1/messages", json=body, headers=headers)

    def lookup(self, envelope: Envelope) -> outcomes.LookupOutcome:
        try:
            response = self._exchange(
                "GET", "/v1/messages", params={"idempotency_key": envelope.key}
            )
        except httpx.HTTPError as exc:
            return outcomes.LookupFailed(outcomes.classify_exception(exc).code, str(exc)[:500])
        if response.status_code == 404:
            return outcomes.Absent()
        outcome = outcomes.classify_response(response)
        if isinstance(outcome, outcomes.Delivered):
            return outcomes.Found(outcome.provider_ref, response.status_code)
        return outcomes.LookupFailed(outcome.code, outcome.reason, response.status_code)
