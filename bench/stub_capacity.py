"""Stub capacity: how many ``POST /v1/messages`` per second the stub provider answers, so that
the other benchmarks know it is not their bottleneck.

Two clients, each for ``--seconds``: (a) raw keep-alive sockets, 2 processes x 4 connections,
one request at a time per connection (the cheapest client, so the stub is what is measured);
(b) httpx, one process, 8 threads sharing one pooled ``httpx.Client`` (the workers' client).
Every request has its own key, so every one records an effect. The stub runs in its own
process, on the same 2 cores as the clients.

    python -m bench.stub_capacity [--seconds 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import threading
import time
import uuid
from typing import Any

from bench.common import STUB_PORT, STUB_URL, log, report, row, session

BODY = b'{"to":"+12015550123","body":"your code is 482901"}'


def _request(key: str) -> bytes:
    return (
        f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:{STUB_PORT}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n"
        f"Idempotency-Key: {key}\r\n\r\n"
    ).encode() + BODY


def _raw_connection(deadline: float, counts: list[int], index: int) -> None:
    prefix = uuid.uuid4().hex[:12]
    sock = socket.create_connection(("127.0.0.1", STUB_PORT))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = 0
    buf = b""
    try:
        while time.monotonic() < deadline:
            sock.sendall(_request(f"{prefix}-{n}"))
            while b"\r\n\r\n" not in buf:
                buf += sock.recv(65536)
            head, _, buf = buf.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 201"):
                raise RuntimeError(head[:80])
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(buf) < length:
                buf += sock.recv(65536)
            buf = buf[length:]
            n += 1
    finally:
        sock.close()
    counts[index] = n


def _raw_process(deadline: float, connections: int, out: Any) -> None:
    counts = [0] * connections
    threads = [
        threading.Thread(target=_raw_connection, args=(deadline, counts, i))
        for i in range(connections)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(sum(counts))


def raw_rate(seconds: float, processes: int = 2, connections: int = 4) -> float:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    start = time.monotonic()
    deadline = start + seconds
    procs = [
        ctx.Process(target=_raw_process, args=(deadline, connections, out))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=seconds + 30) for _ in procs)
    elapsed = time.monotonic() - start
    for p in procs:
        p.join(10)
    return float(total / elapsed)


def httpx_rate(seconds: float, threads: int = 8) -> float:
    import httpx

    counts = [0] * threads
    deadline = time.monotonic() + seconds
    prefix = uuid.uuid4().hex[:12]
    payload = json.loads(BODY)
    with httpx.Client(
        base_url=STUB_URL, limits=httpx.Limits(max_connections=64, max_keepalive_connections=32)
    ) as client:

        def run(index: int) -> None:
            n = 0
            while time.monotonic() < deadline:
                r = client.post(
                    "/v1/messages",
                    json=payload,
                    headers={"Idempotency-Key": f"{prefix}-{index}-{n}"},
                )
                if r.status_code != 201:
                    raise RuntimeError(r.status_code)
                n += 1
            counts[index] = n

        start = time.monotonic()
        pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed = time.monotonic() - start
    return sum(counts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    with session() as procs:
        stub = procs.stub()
        log("raw keep-alive sockets")
        raw = raw_rate(args.seconds)
        effects_raw = len(stub.effects())
        stub.reset()
        log("httpx, 8 threads")
        via_httpx = httpx_rate(args.seconds)
        stub.reset()
    figures = {
        "raw_requests_per_s": round(raw),
        "httpx_requests_per_s": round(via_httpx),
        "raw_effects_recorded": effects_raw,
        "seconds": args.seconds,
    }
    rows = [
        row(
            "stub POST /v1/messages, raw keep-alive client (2 proc x 4 conn)",
            None,
            "several thousand/s",
            raw >= 2000,
            f"{raw:,.0f} req/s",
        ),
        row(
            "stub POST /v1/messages, httpx client (8 threads)",
            None,
            "",
            None,
            f"{via_httpx:,.0f} req/s",
        ),
    ]
    report("stub_capacity", figures, rows)


if __name__ == "__main__":
    main()
