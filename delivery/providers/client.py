"""The base of the built-in adapters: one ``httpx.HTTPTransport`` per provider, and ``close``.

Every adapter of this package sends through one transport made from its ``ProviderConfig``,
called through httpx's public transport API (``handle_request(httpx.Request)``), without
``httpx.Client`` on top: the Client's per-request layers (merging the base URL and headers,
the cookie jar, the auth flow, the redirect loop, its logging) cost some 0.3 ms of CPU per
request (``bench.http_cost``), and we use none of them. What they did for us is done here,
once per provider where it can be:

- the URL: each path under ``base_url`` is merged once, as httpx merges it (the base gets a
  trailing ``/``, the path's leading ``/`` goes), and kept with its ``Host`` header
  (``_url``); a query (a lookup's ``params``) is merged into it with ``copy_merge_params``; an
  absolute URL (a webhook's recipient) is parsed per message.
- the headers: httpx's defaults (``Accept: */*``, ``Connection: keep-alive``), our
  ``User-Agent`` and ``Accept-Encoding: gzip, deflate``, then the adapter's (its credentials),
  merged once; a request's own headers (``Idempotency-Key``) come last and win.
- the body: JSON compact as httpx writes it (``separators=(",", ":")``, UTF-8, no NaN), or a
  form (``application/x-www-form-urlencoded``), or bytes as they are; with ``Content-Length``.
- the timeouts: per phase (``[timeouts]``, ``[providers.NAME.timeouts]``), in the request's
  ``timeout`` extension, as httpx's Client passes them (httpx's docs, "Request Extensions").
- the proxy: chosen once, at construction, for the provider's base URL from the environment
  (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) by the standard library's
  ``urllib.request.getproxies`` and ``proxy_bypass`` (``getproxies`` is what httpx reads),
  giving ``httpx.HTTPTransport(proxy=...)``: the same path with or without one. An injected
  transport is used as it is (tests pass ``httpx.MockTransport``, webhooks their address
  guard): no proxy then.
- no redirect is followed (a 3xx is the provider's answer) and no cookie is kept: nothing here
  follows or stores; credentials travel as headers.

``_post`` sends and maps the result to an outcome; ``close`` releases the connections
(``Service.close`` calls it).

Answers are bounded in ``_exchange``, the one place an adapter reads one:

- the body is streamed (``Response.iter_raw``) and kept up to ``BODY_LIMIT`` bytes
  (64 KiB) after decoding (a lookup may ask for more); the rest is not read. gzip and deflate
  are decoded here, chunk by chunk with the same limit, so a compression bomb inflates no
  further; another encoding counts as an empty body.
- the whole exchange (pool, connect, write, read of headers and body) has a deadline: the
  provider's ``timeouts.total``, which ``send_lease`` must exceed. A body still dripping in at
  the deadline ends the exchange with ``httpx.ReadTimeout`` (unknown: the request was sent);
  each read of the body also waits no longer than what is left of the deadline (the request's
  ``timeout`` extension, which httpcore reads when the body is first read).
- httpx's errors come out as ``httpx.Client`` raises them, with their ``request`` set.
"""

from __future__ import annotations

import json as jsonlib
import logging
import time
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import httpx

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core.outcomes import Outcome, classify_exception

__all__ = [
    "BODY_LIMIT",
    "DEFAULT_LIMITS",
    "USER_AGENT",
    "PooledClient",
    "parse_json",
    "proxy_for",
    "timeout",
]

USER_AGENT = "delivery/0.1"
BODY_LIMIT = 64 * 1024
#: httpx's own default pool: 100 connections, 20 of them kept idle (5 s).
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)
#: Raw bytes read per kept byte at most (compressed bodies that decode to nothing).
_RAW_FACTOR = 4
_DROPPED = {b"content-encoding", b"content-length", b"transfer-encoding"}
_URL_CACHE = 64
_WITH_BODY = ("POST", "PUT", "PATCH")  # an empty one is still sent as Content-Length: 0
_JSON = b"application/json"
_FORM = b"application/x-www-form-urlencoded"

log = logging.getLogger("delivery.providers")


def timeout(timeouts: Timeouts) -> httpx.Timeout:
    """httpx's per-phase timeout from ours."""
    t = timeouts
    return httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool)


def proxy_for(url: str | httpx.URL | None) -> str | None:
    """The proxy the environment names for ``url`` (``getproxies``: the scheme's, else
    ``all``), None when there is none or ``proxy_bypass`` says the host goes direct
    (``NO_PROXY``). A proxy given without a scheme is ``http://``, as httpx reads it."""
    if not url:
        return None
    target = httpx.URL(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(target.scheme) or proxies.get("all")
    if not proxy or not target.host:
        return None
    host = target.host if target.port is None else f"{target.host}:{target.port}"
    if urllib.request.proxy_bypass(host):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def parse_json(response: httpx.Response) -> Any:
    """The answer's JSON value; None for an empty body or one that is not JSON."""
    try:
        return jsonlib.loads(response.content) if response.content else None
    except ValueError:
        return None


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
    """An adapter's ``name`` and its transport (``self._transport``); ``headers`` come after
    httpx's defaults and our ``User-Agent``; relative URLs go under ``base_url``; ``limits``
    size the pool of the transport made here (not of an injected one)."""

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
        self._timeouts = timeout(config.timeouts).as_dict()
        self._base = _with_slash(httpx.URL(base_url)) if base_url else None
        merged = {
            "accept": ("Accept", "*/*"),
            "accept-encoding": ("Accept-Encoding", "gzip, deflate"),
            "connection": ("Connection", "keep-alive"),
            "user-agent": ("User-Agent", USER_AGENT),
        }
        for key, value in (headers or {}).items():
            merged.pop(key.lower(), None)  # as httpx.Headers.update: the adapter's wins
            merged[key.lower()] = (key, value)
        self._headers = [(k.encode("ascii"), v.encode("ascii")) for k, v in merged.values()]
        self._header_names = frozenset(k.encode("ascii") for k in merged)
        if transport is None:
            transport = httpx.HTTPTransport(limits=limits, proxy=proxy_for(self._base))
        self._transport = transport
        self._urls: dict[str, tuple[httpx.URL, bytes]] = {}

    def _url(self, url: str) -> tuple[httpx.URL, bytes]:
        """The request's URL and its ``Host`` header: a relative one under ``base_url``
        (merged as ``httpx.Client`` merges it, kept per path), an absolute one as it is."""
        found = self._urls.get(url)
        if found is not None:
            return found
        merge = httpx.URL(url)
        if merge.is_relative_url and self._base is not None:
            merge = self._base.copy_with(raw_path=self._base.raw_path + merge.raw_path.lstrip(b"/"))
        found = (merge, merge.netloc)
        if url.startswith("/") and "?" not in url and len(self._urls) < _URL_CACHE:
            self._urls[url] = found
        return found

    def _request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        data: Mapping[str, str] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        """The ``httpx.Request`` that ``httpx.Client.build_request`` would build, with the
        headers it would send (``Host`` first, the body's last)."""
        target, host = self._url(url)
        if params:
            target = target.copy_merge_params(params)
        content_type = None
        if json is not None:
            content = jsonlib.dumps(
                json, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode()
            content_type = _JSON
        elif data is not None:
            content = urlencode(data).encode()
            content_type = _FORM
        own = [(k.encode("ascii"), v.encode("ascii")) for k, v in (headers or {}).items()]
        names = {key.lower() for key, _ in own}
        base = self._headers
        if not names.isdisjoint(self._header_names):
            base = [(k, v) for k, v in base if k.lower() not in names]
        lines = [(b"Host", host)] if host else []
        lines += base
        lines += own
        if content_type is not None and b"content-type" not in names:
            lines.append((b"Content-Type", content_type))
        if content is not None:
            lines.append((b"Content-Length", str(len(content)).encode()))
        elif method in _WITH_BODY:
            lines.append((b"Content-Length", b"0"))
        return httpx.Request(
            method,
            target,
            headers=lines,
            stream=httpx.ByteStream(content or b""),
            extensions={"timeout": dict(self._timeouts)},
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
        the deadline (the module docstring). Raises httpx's errors like ``Client.request``."""
        deadline = time.monotonic() + self._deadline
        request = self._request(
            method, url, params=params, json=json, data=data, content=content, headers=headers
        )
        try:
            response = self._transport.handle_request(request)
            response.request = request
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
        except httpx.RequestError as exc:  # as httpx.Client raises them: with their request
            exc.request = request
            raise
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
        self._transport.close()


def _with_slash(url: httpx.URL) -> httpx.URL:
    """``url`` ending in ``/``, as ``httpx.Client`` keeps its ``base_url``."""
    if url.raw_path.endswith(b"/"):
        return url
    return url.copy_with(raw_path=url.raw_path + b"/")
