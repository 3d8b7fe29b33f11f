"""The reference HTTP provider (kind ``http``; DESIGN section 7; the stub speaks it).

- ``POST {base}/v1/messages`` with JSON ``{"to": ..., **payload}`` and ``Idempotency-Key``.
- ``GET {base}/v1/messages?idempotency_key=K``: 200 with the message, or 404.
- ``Authorization: Bearer <secret>`` when ``api_key_env`` names an environment variable.
"""

from __future__ import annotations

import httpx

from delivery.config.settings import ProviderConfig
from delivery.pipeline.outcomes import (
    Absent,
    Delivered,
    Found,
    LookupFailed,
    LookupOutcome,
    Outcome,
    classify_exception,
    classify_response,
)
from delivery.providers.base import Envelope
from delivery.providers.client import PooledClient

__all__ = ["HttpProvider"]


class HttpProvider(PooledClient):
    def __init__(self, config: ProviderConfig, transport: httpx.BaseTransport | None = None):
        secret = config.api_key()
        super().__init__(
            config,
            transport,
            base_url=config.base_url,
            headers={"Authorization": f"Bearer {secret}"} if secret else {},
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )

    def send(self, envelope: Envelope) -> Outcome:
        body = {"to": envelope.to, **envelope.payload}
        try:
            response = self._client.post(
                "/v1/messages", json=body, headers={"Idempotency-Key": envelope.key}
            )
        except httpx.HTTPError as exc:
            return classify_exception(exc)
        return classify_response(response)

    def lookup(self, envelope: Envelope) -> LookupOutcome:
        try:
            response = self._client.get("/v1/messages", params={"idempotency_key": envelope.key})
        except httpx.HTTPError as exc:
            return LookupFailed(classify_exception(exc).code, str(exc)[:500])
        if response.status_code == 404:
            return Absent()
        outcome = classify_response(response)
        if isinstance(outcome, Delivered):
            return Found(outcome.provider_ref, response.status_code)
        return LookupFailed(outcome.code, outcome.reason, response.status_code)
