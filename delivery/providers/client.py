"""The base of the built-in adapters: one ``httpx.Client`` per provider, and ``close``.

What the Client holds, and how it connects (its transport, proxies, no redirect, no cookie):
docs/providers.md, "The HTTP transport". ``_exchange`` is the one place an adapter reads an
answer, which is why the body is read raw (``Response.iter_raw``) and not by the Client: it is
kept up to ``BODY_LIMIT`` bytes after decoding (a lookup may ask for more) and the rest is not
read; gzip and deflate are decoded here, chunk by chunk within the same limit, so a
compression bomb inflates no further (another encoding counts as an empty body); and the whole
exchange has a deadline, the provider's ``timeouts.total`` (which ``send_lease`` must exceed):
a body still dripping in then ends it with ``httpx.ReadTimeout`` (unknown: the request was
sent). ``_post`` sends and maps the result to an outcome; ``Service.close`` calls ``close``.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core.outcomes import Outcome, classify_exception, parse_json

__all__ = ["BODY_LIMIT", "DEFAULT_LIMITS", "USER_AGENT", "PooledClient", "parse_json", "timeout"]

USER_AGENT = "delivery/0.1"
BODY_LIMIT = 64 * 1024
#: httpx's own default pool: 100 connections, 20 of them kept idle (5 s).
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)
#: Raw bytes read per kept byte at most (compressed bodies that decode to nothing).
_RAW_FACTOR = 4
_DROPPED = {b"content-encoding", b"content-length", b"transfer-encoding"}

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
    """An adapter's ``name`` and its ``httpx.Client`` (``self._client``); ``headers`` come after
    httpx's defaults and ours; relative URLs go under ``base_url``; ``limits`` size the pool of
    the Client's own transport (not of an injected one)."""

    def __init__(
        self,
        config: ProviderConfig,
        transport: httpx.BaseTransport | None = None,
        *,
        base_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        self.name = config.name
        self._deadline = config.timeouts.total
        self._client = httpx.Client(
            base_url=base_url or "",
            headers={
                "User-Agent": USER_AGENT,
                "Accept-Encoding": "gzip, deflate",
                **(headers or {}),
            },
            cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),  # keeps none
            timeout=timeout(config.timeouts),
            follow_redirects=False,
            limits=limits,
            transport=transport,  # None: the Client's own, with the environment's proxies
        )

    def _exchange(
        self,
        method: str,
        url: str,
        *,
        limit: int = BODY_LIMIT,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        data: Mapping[str, str] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """One request; the answer with its body read up to ``limit`` bytes (decoded), within
        the deadline (the module docstring). Raises httpx's errors as ``Client.send`` does."""
        deadline = time.monotonic() + self._deadline
        request = self._client.build_request(
            method, url, params=params, json=json, data=data, content=content, headers=headers
        )
        response = self._client.send(request, stream=True)
        try:
            # each read of the body waits no longer than what is left of the deadline
            timeouts = request.extensions["timeout"]
            left = max(0.001, deadline - time.monotonic())
            read = timeouts.get("read")
            timeouts["read"] = left if read is None else min(read, left)
            if response.is_stream_consumed:  # a transport that read it already (tests)
                body = bytearray(response.content[:limit])
            else:
                body = self._read(response, limit, deadline)
        finally:
            response.close()
        if log.isEnabledFor(logging.DEBUG):  # a relative path only: a webhook URL is a recipient
            log.debug(
                "%s: %s %s answered %d (%d bytes kept)",
                self.name,
                method,
                url.partition("?")[0] if url.startswith("/") else "(the recipient's URL)",
                response.status_code,
                len(body),
            )
        lines = [(k, v) for k, v in response.headers.raw if k.lower() not in _DROPPED]
        lines.append((b"Content-Length", str(len(body)).encode()))  # of the body kept
        return httpx.Response(
            response.status_code,
            headers=lines,
            content=bytes(body),
            request=request,
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
        self,
        classify: Callable[[httpx.Response], Outcome],
        url: str,
        *,
        json: Any = None,
        data: Mapping[str, str] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Outcome:
        """POST and map the result: a transport error through ``classify_exception`` (the one
        mapping point), an answer through the adapter's ``classify``."""
        try:
            response = self._exchange(
                "POST", url, json=json, data=data, content=content, headers=headers
            )
        except httpx.HTTPError as exc:
            return classify_exception(exc)
        return classify(response)

    def close(self) -> None:
        self._client.close()
