"""The base of the built-in adapters: one pooled httpx client per provider, and ``close``.

Every adapter of this package sends over one ``httpx.Client`` built from its
``ProviderConfig``: per-phase timeouts (``[timeouts]``, ``[providers.NAME.timeouts]``), our
``User-Agent``, an injectable transport (tests pass ``httpx.MockTransport``), and whatever the
wire protocol adds (a base URL, auth, headers, connection limits). ``_post`` sends and maps
the result to an outcome; ``close`` releases its connections (``Service.close`` calls it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.pipeline.outcomes import Outcome, classify_exception

__all__ = ["USER_AGENT", "PooledClient", "timeout"]

USER_AGENT = "delivery/0.1"


def timeout(timeouts: Timeouts) -> httpx.Timeout:
    """httpx's per-phase timeout from ours."""
    t = timeouts
    return httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool)


class PooledClient:
    """An adapter's ``name`` and its client (``self._client``); ``headers`` come after our
    ``User-Agent``, any other keyword goes to ``httpx.Client`` as it is."""

    def __init__(
        self,
        config: ProviderConfig,
        transport: httpx.BaseTransport | None = None,
        *,
        headers: dict[str, str] | None = None,
        **options: Any,
    ) -> None:
        self.name = config.name
        self._client = httpx.Client(
            headers={"User-Agent": USER_AGENT, **(headers or {})},
            timeout=timeout(config.timeouts),
            transport=transport,
            **options,
        )

    def _post(
        self, classify: Callable[[httpx.Response], Outcome], url: str, **request: Any
    ) -> Outcome:
        """POST and map the result: a transport error through ``classify_exception`` (the one
        mapping point), an answer through the adapter's ``classify``."""
        try:
            response = self._client.post(url, **request)
        except httpx.HTTPError as exc:
            return classify_exception(exc)
        return classify(response)

    def close(self) -> None:
        self._client.close()
