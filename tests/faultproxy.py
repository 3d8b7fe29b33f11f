"""A fault-injecting TCP proxy for the chaos tests (our own small toxiproxy).

It sits between the worker and the stub provider: the worker's provider ``base_url`` is the
proxy's ``url``. Faults are switched on and off while a run is going, from the test process::

    with FaultProxy(stub_port, seed=1) as proxy:
        proxy.set(blackhole_rate=0.3)   # 30% of requests: forwarded, response never returned
        proxy.set(reset_rate=0.1)       # 10%: forwarded, then the client connection is reset
        proxy.set(latency_ms=200)       # each request waits 200 ms before it is forwarded
        proxy.set(bandwidth=2048)       # bytes per second, each direction, per connection
        proxy.set(close_on_accept=True) # accept, then close at once (no request gets through)
        proxy.refuse()                  # stop listening: connection refused; open ones are cut
        proxy.resume()                  # listen again on the same port
        proxy.clear()                   # every fault off, listening

The fate of each *exchange* (one HTTP request and its response on a keep-alive connection) is
drawn when its first request bytes arrive; the next exchange starts with the client's next
bytes after response bytes came back (HTTP/1.1 without pipelining, as httpx speaks it). A
``blackhole`` exchange forwards the request, so the provider acts, and swallows everything the
provider answers until the client gives up; a ``reset`` exchange forwards the request and resets
the client connection (RST) as soon as the provider starts answering. ``stats()`` counts what
was injected.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, fields, replace
from types import TracebackType

__all__ = ["FaultProxy", "Faults", "ProxyStats"]

_CHUNK = 65536


@dataclass(frozen=True, slots=True)
class Faults:
    """What the proxy does to new exchanges and connections (all off by default)."""

    latency_ms: float = 0.0
    blackhole_rate: float = 0.0
    reset_rate: float = 0.0
    bandwidth: float | None = None
    close_on_accept: bool = False

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise ValueError("latency_ms: must be >= 0")
        for name in ("blackhole_rate", "reset_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}: must be between 0 and 1")
        if self.blackhole_rate + self.reset_rate > 1.0:
            raise ValueError("blackhole_rate + reset_rate: must not exceed 1")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ValueError("bandwidth: must be > 0 bytes per second, or None")


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since the proxy started (or since ``reset_stats``)."""

    connections: int = 0
    exchanges: int = 0
    blackholed: int = 0
    reset: int = 0
    closed_on_accept: int = 0
    cut: int = 0
    upstream_down: int = 0


class _Link:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.fate = "idle"  # idle | normal | blackhole | reset
        self.closed = threading.Event()

    def start(self) -> None:
        for target, name in ((self._up, "up"), (self._down, "down")):
            threading.Thread(target=target, name=f"faultproxy-{name}", daemon=True).start()

    def close(self, *, rst: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                if rst and sock is self.client:
                    # Linger 0: the last close sends RST. SHUT_RD wakes the other pump's recv
                    # without sending FIN, so that close is the RST.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RD)
                else:
                    sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy._forget(self)

    def _throttle(self, size: int) -> None:
        bandwidth = self.proxy.faults.bandwidth
        if bandwidth:
            time.sleep(size / bandwidth)

    def _chunk_size(self) -> int:
        bandwidth = self.proxy.faults.bandwidth
        return _CHUNK if not bandwidth else max(1, min(_CHUNK, int(bandwidth / 10)))

    def _up(self) -> None:
        """Client -> provider: each new exchange draws its fate and may wait for latency."""
        try:
            while not self.closed.is_set():
                data = self.client.recv(self._chunk_size())
                if not data:
                    break
                if self.fate == "idle":
                    self.fate = self.proxy._draw()
                    latency = self.proxy.faults.latency_ms
                    if latency:
                        self.proxy._calm.wait(latency / 1000.0)
                self._throttle(len(data))
                self.upstream.sendall(data)
        except OSError:
            pass
        self.close()

    def _down(self) -> None:
        """Provider -> client: forward, swallow (blackhole) or reset, by the exchange's fate."""
        try:
            while not self.closed.is_set():
                data = self.upstream.recv(self._chunk_size())
                if not data:
                    break
                if self.fate == "blackhole":
                    continue  # the client waits until its read timeout, then closes
                if self.fate == "reset":
                    self.close(rst=True)
                    return
                self._throttle(len(data))
                self.client.sendall(data)
                self.fate = "idle"
        except OSError:
            pass
        self.close()


class FaultProxy:
    """A threaded TCP proxy from ``url`` to ``upstream_host:upstream_port`` with faults."""

    def __init__(
        self,
        upstream_port: int,
        *,
        upstream_host: str = "127.0.0.1",
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int | None = None,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.faults = Faults()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._stats = ProxyStats()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._port = port
        self._stopped = False
        # Set (and replaced by a fresh one) when the faults are cleared: an exchange waiting
        # out its latency goes on at once, so that a worker can finish its sends and stop.
        self._calm = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def stop(self) -> None:
        """Stop listening and cut every connection (idempotent)."""
        self._stopped = True
        self._close_listener()
        self.cut()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- faults -------------------------------------------------------------------------------

    def set(self, **changes: float | bool | None) -> Faults:
        """Change some faults (see ``Faults``); ValueError names a bad one. Applies to new
        exchanges at once, to bandwidth and latency of open connections too."""
        names = {f.name for f in fields(Faults)}
        for name in changes:
            if name not in names:
                raise ValueError(f"unknown fault {name!r} (expected one of {sorted(names)})")
        with self._lock:
            self.faults = replace(self.faults, **changes)  # type: ignore[arg-type]
            return self.faults

    def clear(self) -> None:
        """Every fault off and listening again; exchanges waiting out a latency go on now."""
        with self._lock:
            self.faults = Faults()
            calm, self._calm = self._calm, threading.Event()
        calm.set()
        self.resume()

    def refuse(self, *, cut: bool = True) -> None:
        """Stop listening, so that connecting is refused; with ``cut``, also reset the
        connections that are open (as a provider that goes down would)."""
        self._close_listener()
        if cut:
            self.cut()

    def resume(self) -> None:
        """Listen again on the same port (a no-op when listening)."""
        if self._listener is None and not self._stopped:
            self._listen()

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def cut(self) -> int:
        """Reset every open connection; return how many."""
        with self._lock:
            links = list(self._links)
            self._count(cut=len(links))
        for link in links:
            link.close(rst=True)
        return len(links)

    def stats(self) -> ProxyStats:
        with self._lock:
            return self._stats

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = ProxyStats()

    # --- internals ----------------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        """Add to counters; the caller holds ``_lock``."""
        self._stats = replace(
            self._stats, **{k: getattr(self._stats, k) + v for k, v in deltas.items()}
        )

    def _draw(self) -> str:
        with self._lock:
            faults = self.faults
            roll = self._rng.random()
            if roll < faults.blackhole_rate:
                fate = "blackhole"
                self._count(exchanges=1, blackholed=1)
            elif roll < faults.blackhole_rate + faults.reset_rate:
                fate = "reset"
                self._count(exchanges=1, reset=1)
            else:
                fate = "normal"
                self._count(exchanges=1)
            return fate

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        sock.listen(512)
        sock.settimeout(0.05)
        self._port = int(sock.getsockname()[1])
        self._listener = sock
        self._acceptor = threading.Thread(
            target=self._accept_loop, args=(sock,), name="faultproxy-accept", daemon=True
        )
        self._acceptor.start()

    def _close_listener(self) -> None:
        sock, self._listener = self._listener, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.close()
        if self._acceptor is not None and self._acceptor is not threading.current_thread():
            self._acceptor.join(timeout=5)
        self._acceptor = None

    def _accept_loop(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._count(connections=1)
                close_now = self.faults.close_on_accept
                if close_now:
                    self._count(closed_on_accept=1)
            if close_now:
                with contextlib.suppress(OSError):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                with self._lock:
                    self._count(upstream_down=1)
                client.close()
                continue
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, upstream)
            with self._lock:
                self._links.add(link)
            link.start()
