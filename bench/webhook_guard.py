"""Webhook address guard: what resolving once, checking every answer and connecting to a
checked address costs per send, next to the same adapter on a plain httpx transport.

One in-process receiver on 127.0.0.1 answers 204; the guarded adapter allowlists it
(``allow_networks = ["127.0.0.1/32"]``, the documented way for internal receivers), the
baseline is the same ``WebhookProvider`` given ``httpx.HTTPTransport()``. Two cases, each
interleaved in blocks of ``--block`` sends for ``--rounds`` rounds (the first dropped), median
ms per send:

- ``keep-alive``: connections are reused, so the guard runs once per connection;
- ``new connection``: the receiver closes every connection, so every send resolves, checks
  and connects again (the guard's whole cost on each send).

    python -m bench.webhook_guard [--rounds 5] [--block 300]
"""

from __future__ import annotations

import argparse
import base64
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from bench.common import median, report, row
from delivery.config.loading import settings_from_mapping
from delivery.providers import Envelope
from delivery.providers.webhook import WebhookProvider

SECRET_ENV = "BENCH_WEBHOOK_SECRET"


def receiver(close: bool) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(204)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def provider(guarded: bool) -> WebhookProvider:
    table = {"kind": "webhook", "secret_env": SECRET_ENV, "allow_networks": ["127.0.0.1/32"]}
    settings = settings_from_mapping(
        {"providers": {"hooks": table}},
        database_url="sqlite://",
        broker_url="memory://",
        redis_url=None,
    )
    transport = None if guarded else httpx.HTTPTransport()
    return WebhookProvider(settings.providers["hooks"], transport)


def per_send_ms(send: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        outcome = send()
        assert outcome.kind == "delivered", outcome
    return (time.perf_counter() - start) * 1000 / n


def measure(close: bool, rounds: int, block: int) -> dict[str, float]:
    server = receiver(close)
    url = f"http://127.0.0.1:{server.server_address[1]}/hooks/bench"
    adapters = {"guarded": provider(True), "plain": provider(False)}
    envelope = Envelope("bench-1:hook", "webhook", url, {"event": "bench"})
    samples: dict[str, list[float]] = {name: [] for name in adapters}
    try:
        for n in range(rounds):
            for name, adapter in adapters.items():
                ms = per_send_ms(lambda a=adapter: a.send(envelope), block)
                if n:  # the first round warms up
                    samples[name].append(ms)
    finally:
        for adapter in adapters.values():
            adapter.close()
        server.shutdown()
        server.server_close()
    return {name: round(median(values), 4) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=300)
    args = parser.parse_args()
    os.environ[SECRET_ENV] = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    before = [round(x, 2) for x in os.getloadavg()]
    keep = measure(False, args.rounds, args.block)
    fresh = measure(True, args.rounds, args.block)
    figures = {
        "keep_alive_ms": keep,
        "new_connection_ms": fresh,
        "rounds": args.rounds,
        "block": args.block,
        "loadavg_before": before,
    }
    rows = [
        row(
            "webhook send, keep-alive: guarded / plain transport (ms per send)",
            keep["guarded"] / keep["plain"],
            "<= 1.10x",
            keep["guarded"] / keep["plain"] <= 1.10,
            f"{keep['guarded']} ms",
            f"{keep['plain']} ms (plain httpx transport)",
        ),
        row(
            "webhook send, new connection each: guarded / plain (ms per send)",
            fresh["guarded"] / fresh["plain"],
            "<= 1.25x",
            fresh["guarded"] / fresh["plain"] <= 1.25,
            f"{fresh['guarded']} ms",
            f"{fresh['plain']} ms (plain httpx transport)",
        ),
    ]
    report("webhook_guard", figures, rows)


if __name__ == "__main__":
    main()
