"""The base of the built-in adapters: one pooled ``httpx.Client`` per provider, and ``close``.

Every adapter of this package sends through one ``httpx.Client`` made from its
``ProviderConfig``: per-phase timeouts (``[timeouts]``, ``[providers.NAME.timeouts]``), our
``User-Agent``, and whatever the wire protocol adds (a base URL, headers, connection limits).
Its transport is httpx's own (``httpx.HTTPTransport``: httpcore's connection pool), through the
proxy the environment names if any (``HTTPS_PROXY`` and friends, as httpx honours them), unless
one is injected (tests pass ``httpx.MockTransport``, webhooks their address guard). No redirect
is followed and no cookie kept (the client's jar refuses them all); credentials travel as
headers. ``_post`` sends and maps the result to an outcome; ``close`` releases the connections
(``Service.close`` calls it).

Answers are bounded in ``_exchange``, the one place an adapter reads one:

- the body is streamed (``Response.iter_raw``) and kept up to ``BODY_LIMIT`` bytes (64 KiB)
  after decoding (a lookup may ask for more); the rest is not read. gzip and deflate are
  decoded here, chunk by chunk with the same limit, so a compression bomb inflates no further;
  another encoding counts as an empty body.
- the whole exchange (pool, connect, write, read of headers and body) has a deadline: the
  provider's ``timeouts.total``, which ``send_lease`` must exceed. A body still dripping in at
  the deadline ends the exchange with ``httpx.ReadTimeout`` (unknown: the request was sent);
  each read of the body also waits no longer than what is left of the deadline (the request's
  ``timeout`` extension, which httpcore reads when the body is first read).
"""

from __future__ import annotations

import http.cookiejar
import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

import httpx

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core.outcomes import Outcome, classify_exception

__all__ = ["BODY_LIMIT", "USER_AGENT", "PooledClient", "timeout"]

USER_AGENT = "delivery/0.1"
BODY_LIMIT = 64 * 1024
#: Raw bytes read per kept byte at most (compressed bodies that decode to nothing).
_RAW_FACTOR = 4
_DROPPED = {b"content-encoding", b"content-length", b"transfer-encoding"}
_URL_CACHE = 64

log = logging.getLogger("delivery.providers")


def timeout(timeouts: Timeouts) -> httpx.Timeout:
    """httpx's per-phase timeout from ours."""
    t = timeouts
    return httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool)


class _Decoder:
    """gzip/deflate/identity, decoding at most ``room`` bytes per call."""

    def __init__(self, encoding: str) -> None:
        names = [e.strip() for e in encoding.lower().split(",") if e.strip()]
        self.supported = all(n in ("identity", "gzip", "x-gzip", "deflate") for n in names)
        self._zlib = [
            zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, detected
            for n in names
            if n in ("gzip", "x-gzip", "deflate")
        ]

    def decode(self, chunk: bytes, room: int) -> bytes:
        if not self.supported:
            return b""
        for inflater in reversed(self._zlib):  # encodings were applied in order
            if not chunk:
                break
            try:
                chunk = inflater.decompress(chunk, room)
            except zlib.error:
                self.supported = False
                return b""
        return chunk[:room]


class PooledClient:
    """An adapter's ``name`` and its client (``self._client``); ``headers`` come after our
    ``User-Agent``, any other keyword goes to ``httpx.Client`` as it is (``limits``,
    ``base_url``)."""

    def __init__(
        self,
        config: ProviderConfig,
        transport: httpx.BaseTransport | None = None,
        *,
        headers: dict[str, str] | None = None,
        **options: Any,
    ) -> None:
        self.name = config.name
        self._deadline = config.timeouts.total
        self._client = httpx.Client(
            headers={
                "User-Agent": USER_AGENT,
                "Accept-Encoding": "gzip, deflate",
                **(headers or {}),
            },
            cookies=http.cookiejar.CookieJar(
                http.cookiejar.DefaultCookiePolicy(allowed_domains=())  # no domain: none kept
            ),
            timeout=timeout(config.timeouts),
            transport=transport,
            **options,
        )
        self._urls: dict[str, httpx.URL] = {}

    def _url(self, url: str) -> httpx.URL | str:
        """A path's absolute URL under ``base_url``, merged once (httpx parses it each time)."""
        if not url.startswith("/") or "?" in url:
            return url
        found = self._urls.get(url)
        if found is None:
            found = self._client.build_request("GET", url).url
            if len(self._urls) < _URL_CACHE:
                self._urls[url] = found
        return found

    def _exchange(
        self, method: str, url: str, *, limit: int = BODY_LIMIT, **request: Any
    ) -> httpx.Response:
        """One request; the answer with its body read up to ``limit`` bytes (decoded), within
        the deadline (the module docstring). Raises httpx's errors like ``Client.request``."""
        deadline = time.monotonic() + self._deadline
        with self._client.stream(method, self._url(url), **request) as response:
            timeouts = response.request.extensions.get("timeout")
            if isinstance(timeouts, dict):  # each read of the body: no longer than what is left
                left = max(0.001, deadline - time.monotonic())
                read = timeouts.get("read")
                timeouts["read"] = left if read is None else min(read, left)
            if response.is_stream_consumed:  # a transport that read it already (tests)
                body = bytearray(response.content[:limit])
            else:
                body = self._read(response, limit, deadline)
        if log.isEnabledFor(logging.DEBUG):  # a relative path only: a webhook URL is a recipient
            log.debug(
                "%s: %s %s answered %d (%d bytes kept)",
                self.name,
                method,
                url.partition("?")[0] if url.startswith("/") else "(the recipient's URL)",
                response.status_code,
                len(body),
            )
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _DROPPED]
        return httpx.Response(
            response.status_code,
            headers=headers,
            content=bytes(body),
            request=response.request,
            extensions={"reason_phrase": response.extensions.get("reason_phrase", b"")},
        )

    def _read(self, response: httpx.Response, limit: int, deadline: float) -> bytearray:
        """The body, decoded, up to ``limit`` bytes; ``ReadTimeout`` past the deadline."""
        decoder = _Decoder(response.headers.get("content-encoding", "identity"))
        body = bytearray()
        raw = 0
        for chunk in response.iter_raw():
            raw += len(chunk)
            body += decoder.decode(chunk, limit - len(body))
            if len(body) >= limit or raw >= limit * _RAW_FACTOR:
                break
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout(
                    f"the answer took longer than {self._deadline:g} s", request=response.request
                )
        return body

    def _post(
        self, classify: Callable[[httpx.Response], Outcome], url: str, **request: Any
    ) -> Outcome:
        """POST and map the result: a transport error through ``classify_exception`` (the one
        mapping point), an answer through the adapter's ``classify``."""
        try:
            response = self._exchange("POST", url, **request)
        except httpx.HTTPError as exc:
            return classify_exception(exc)
        return classify(response)

    def close(self) -> None:
        self._client.close()
