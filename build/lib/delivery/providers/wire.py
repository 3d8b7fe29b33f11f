"""``Wire``: the built-in adapters' HTTP/1.1 transport, keep-alive over the standard library.

An ``httpx.BaseTransport``: adapters still build ``httpx.Request`` and read ``httpx.Response``,
raise and classify httpx's errors, and tests still inject ``httpx.MockTransport``. Under that
interface it writes the request with one ``sendall`` and parses the answer with the standard
library's ``http.client`` over a buffered socket reader, where httpx's default transport goes
through httpcore's connection pool and h11's state machine. A POST through the ``http``
adapter costs 0.51 ms of CPU this way, 0.76 ms on httpx's transport, and 1.00 ms through
``httpx.Client.post`` (``bench/README.md``, ``http_cost``); the HTTP exchange was over half of
a threads-pool worker's CPU.

What it keeps of httpx's behaviour:

- Errors by phase, so ``classify_exception`` still tells "not sent" from "unknown": a refused
  or timed-out connect is ``ConnectError``/``ConnectTimeout``, a full pool ``PoolTimeout``;
  anything after the first byte is written is ``WriteError``/``WriteTimeout``,
  ``ReadError``/``ReadTimeout`` or ``RemoteProtocolError`` (a closed or garbled answer).
- Per-phase timeouts from the request's ``timeout`` extension (connect, write, read, pool),
  read again before every read of the body, so the caller can shorten them as its deadline
  nears (``PooledClient._exchange``).
- A header name or value with CR, LF or NUL is refused before anything is written
  (``LocalProtocolError``), as h11 refuses it.
- Connections: at most ``max_connections`` open (the rest wait up to the pool timeout), at
  most ``max_keepalive`` idle, an idle one dropped after ``keepalive_expiry`` s or when its
  peer closed it (checked before reuse, as httpcore does). A connection goes back to the pool
  only after its answer was read to the end and neither side asked to close it.
- TLS with httpx's default context (certifi, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``),
  verifying the host name.

What it does not do: HTTP/2, proxies, and answers to ``Expect``/``1xx`` interim responses.
``PooledClient`` uses httpx's own transport when a proxy is set in the environment
(``HTTPS_PROXY`` and friends, which httpx honours).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import httpx

__all__ = ["Wire"]

_CHUNK = 64 * 1024


class _Connection:
    __slots__ = ("idle_since", "origin", "sock")

    def __init__(self, sock: socket.socket, origin: tuple[bytes, bytes, int]) -> None:
        self.sock = sock
        self.origin = origin
        self.idle_since = 0.0

    def alive(self) -> bool:
        """Not closed by the peer while idle: nothing is readable (EOF or stray bytes)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _Body(httpx.SyncByteStream):
    """The raw body, read as the caller iterates; closing hands the connection back."""

    def __init__(
        self,
        wire: Wire,
        conn: _Connection,
        answer: http.client.HTTPResponse,
        request: httpx.Request,
    ) -> None:
        self._wire, self._conn, self._answer, self._request = wire, conn, answer, request

    def __iter__(self) -> Iterator[bytes]:
        answer, sock = self._answer, self._conn.sock
        while True:
            sock.settimeout(_timeout(self._request, "read"))
            try:
                chunk = answer.read1(_CHUNK)
            except Exception as exc:
                raise _read_error(exc, self._request) from exc
            if not chunk:
                if answer.length:  # EOF before Content-Length's end (http.client says nothing)
                    raise httpx.RemoteProtocolError(
                        f"the server closed the connection {answer.length} bytes before the "
                        "end of the body",
                        request=self._request,
                    )
                return
            yield chunk

    def close(self) -> None:
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is None:
            return
        answer = self._answer
        done = answer.isclosed() if answer.chunked else answer.length == 0
        reusable = done and not answer.will_close  # read to the end, and kept alive
        answer.close()
        self._wire._release(conn, reusable)


class Wire(httpx.BaseTransport):
    """HTTP/1.1 keep-alive connections to any origin; thread-safe (the module docstring)."""

    def __init__(
        self,
        *,
        max_connections: int = 64,
        max_keepalive: int = 32,
        keepalive_expiry: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._max = max_connections
        self._max_idle = max_keepalive
        self._expiry = keepalive_expiry
        self._ssl = ssl_context
        self._idle: list[_Connection] = []
        self._open = 0
        self._pid = os.getpid()
        self._closed = False
        self._cond = threading.Condition(threading.Lock())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.raw_scheme not in _PORTS:
            raise httpx.UnsupportedProtocol(f"{url.scheme!r} is not http or https", request=request)
        head = _head(request)
        body = request.content if isinstance(request.stream, httpx.ByteStream) else request.read()
        origin = (url.raw_scheme, url.raw_host, url.port or _PORTS.get(url.raw_scheme, 0))
        conn = self._acquire(origin, request)
        try:
            sock = conn.sock
            sock.settimeout(_timeout(request, "write"))
            try:
                sock.sendall(head + body if len(body) < _CHUNK else head)
                if len(body) >= _CHUNK:
                    sock.sendall(body)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc) or "timed out", request=request) from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc), request=request) from exc
            sock.settimeout(_timeout(request, "read"))
            answer = http.client.HTTPResponse(sock, method=request.method)
            try:
                answer.begin()
            except Exception as exc:
                answer.close()
                raise _read_error(exc, request) from exc
        except BaseException:
            self._release(conn, False)
            raise
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.msg.items()]
        return httpx.Response(
            answer.status,
            headers=headers,
            stream=_Body(self, conn, answer, request),
            extensions={
                "http_version": b"HTTP/1.1" if answer.version == 11 else b"HTTP/1.0",
                "reason_phrase": answer.reason.encode("latin-1", "replace"),
            },
        )

    def close(self) -> None:
        """Close the idle connections now, and each one in use when its answer is closed."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()

    # -- the pool ----------------------------------------------------------------------------

    def _acquire(self, origin: tuple[bytes, bytes, int], request: httpx.Request) -> _Connection:
        if os.getpid() != self._pid:  # forked: the parent's connections are not ours to use
            with self._cond:
                inherited, self._idle, self._open, self._pid = self._idle, [], 0, os.getpid()
            for conn in inherited:
                conn.close()  # this process's copy of the descriptor only
        now = time.monotonic()
        stale: list[_Connection] = []
        found: _Connection | None = None
        with self._cond:
            deadline = None
            while True:
                for i in range(len(self._idle) - 1, -1, -1):
                    conn = self._idle[i]
                    if now - conn.idle_since > self._expiry:
                        del self._idle[i]
                        self._open -= 1
                        stale.append(conn)
                    elif found is None and conn.origin == origin:
                        del self._idle[i]
                        found = conn
                if found is not None or self._open < self._max:
                    break
                if self._idle:  # full of idle connections to other origins: make room
                    stale.append(self._idle.pop(0))
                    self._open -= 1
                    break
                wait = _timeout(request, "pool")
                if deadline is None:
                    deadline = now + (wait if wait is not None else 1e9)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise httpx.PoolTimeout("no connection free in the pool", request=request)
                self._cond.wait(left)
                now = time.monotonic()
            if found is None:
                self._open += 1
        for conn in stale:
            conn.close()
        if found is not None:
            if found.alive():
                return found
            found.close()  # closed by the peer while idle: a new one, counted already
        try:
            return self._connect(origin, request)
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _connect(self, origin: tuple[bytes, bytes, int], request: httpx.Request) -> _Connection:
        scheme, host, port = origin
        name = host.decode("ascii")
        timeout = _timeout(request, "connect")
        try:
            sock = socket.create_connection((name, port), timeout=timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if scheme == b"https":
                    if self._ssl is None:
                        self._ssl = httpx.create_ssl_context()
                    sni = request.extensions.get("sni_hostname", name)
                    sock = self._ssl.wrap_socket(sock, server_hostname=sni)
            except BaseException:
                sock.close()
                raise
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        return _Connection(sock, origin)

    def _release(self, conn: _Connection, reusable: bool) -> None:
        keep = reusable and os.getpid() == self._pid
        if keep:
            conn.idle_since = time.monotonic()
        with self._cond:
            self._cond.notify()
            if keep and not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
            self._open -= 1
        conn.close()


_PORTS = {b"http": 80, b"https": 443}


def _timeout(request: httpx.Request, phase: str) -> float | None:
    timeouts = request.extensions.get("timeout")
    return timeouts.get(phase) if isinstance(timeouts, dict) else None


def _head(request: httpx.Request) -> bytes:
    """The request line and headers, refusing CR, LF and NUL anywhere in them."""
    url = request.url
    lines = [request.method.encode("ascii"), b" ", url.raw_path, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    head = b"".join(lines)
    if (
        head.count(b"\n") != len(request.headers.raw) + 2
        or b"\r" in head.replace(b"\r\n", b"")
        or b"\0" in head
    ):
        raise httpx.LocalProtocolError("a header or the target holds CR, LF or NUL")
    return head


def _read_error(exc: BaseException, request: httpx.Request) -> httpx.HTTPError:
    """What reading an answer raised, as httpx's error for that phase (the request was sent)."""
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(str(exc) or "timed out", request=request)
    if isinstance(exc, http.client.HTTPException | ValueError):
        return httpx.RemoteProtocolError(
            f"{type(exc).__name__}: {exc}"[:200] or type(exc).__name__, request=request
        )
    if isinstance(exc, OSError):
        return httpx.ReadError(str(exc), request=request)
    raise exc
