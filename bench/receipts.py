"""Delivery receipts: how many receipts per second ``delivery receiver`` stores, next to how many
messages per second the pipeline itself delivers, in the same run (issue 26: a message can get
two or three receipts, so the receiver must keep up with at least three times the pipeline).

1. The pipeline: ``end_to_end``'s backlog run with the default batches (``enqueue_many`` of
   ``--messages`` drained by beat's relay and one worker, prefork x2), delivered/s.
2. The receiver: ``delivery receiver`` (Granian, its defaults) on the same outbox, whose
   messages are now ``sent``. Their receipts (two per message: ``sent``, then ``delivered``)
   go in two loads, half the messages each: over ``CONNECTIONS`` keep-alive connections (a
   provider calls back on many at once), each waiting for its answer before the next. The
   first load (32) keeps few receipts in flight, so it measures the answer's latency more than
   the receiver; the second (256) keeps every thread of the receiver busy: the figure, its
   capacity. The requests are signed and written out beforehand, and sent over plain sockets
   from one thread, so that the clock measures the receiver (the signature check included)
   and the database rather than an HTTP client on the same two cores; stored receipts/s, the
   answers' p50/p99, and CPU ms per receipt of the receiver's processes and PostgreSQL.

Each side is warmed up first, untimed: the pipeline by ``end_to_end``'s 100 messages, the
receiver by the receipts of the first ``WARM_UP`` messages. ``--pairs`` pipeline/receiver runs
in turn (3); the figure is the ratio of their medians.

    python -m bench.receipts [--messages 8000] [--pairs 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import selectors
import socket
import sys
import time
from typing import Any, cast

from sqlalchemy import func, select, text
from standardwebhooks.webhooks import Webhook

from bench.common import (
    CONFIG,
    PG_URL,
    CpuMeter,
    children,
    database_backends,
    fresh_database,
    log,
    median,
    percentile,
    report,
    row,
    session,
)
from bench.end_to_end import BACKLOG_RUNS, backlog_run
from delivery.core.models import Receipt
from delivery.runtime.db import make_engine
from delivery.testing.processes import ServiceProcess, free_port

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
CONNECTIONS = (32, 256)
"""The loads, in receipts in flight: few (the latency), and as many as the receiver's threads."""
WARM_UP = 100  # messages whose receipts are sent, untimed, before the clock starts


def signed_receipts(keys: list[str]) -> list[tuple[bytes, dict[str, str]]]:
    """Two receipts per key (sent, then delivered), each signed as a provider signs it."""
    signer, now = Webhook(SECRET), dt.datetime.now(dt.UTC)
    out = []
    for n, key in enumerate(keys):
        for status in ("sent", "delivered"):
            body = json.dumps(
                {"id": f"msg_{n}", "idempotency_key": key, "status": status, "code": None}
            ).encode()
            event = f"evt_{n}_{status}"
            headers = {
                "content-type": "application/json",
                "webhook-id": event,
                "webhook-timestamp": str(int(now.timestamp())),
                "webhook-signature": signer.sign(event, now, body),
            }
            out.append((body, headers))
    return out


def request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One HTTP/1.1 POST, as bytes."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def post_all(port: int, parts: list[list[bytes]]) -> tuple[list[int], list[float]]:
    """Send each of ``parts`` in order over a keep-alive connection of its own, each request
    after the answer to the one before, all connections from one thread (a selector): the
    load generator's own cost and thread switches stay small. The answers' status codes, and
    the seconds each took (written -> its answer read).

    The requests are written out beforehand and an answer is read by its status line and
    Content-Length, by hand: this is a load generator on the receiver's two cores, not a
    client. Framed by ``h11`` instead, it cost 0.13-0.16 ms of CPU per request and the
    receiver stored 2,563-2,703 receipts/s against 3,178-3,342 with this one, in turn in one
    session (2026-12-06 08:00, load 2.5-3.7)."""
    codes: list[int] = []
    took: list[float] = []
    select = selectors.DefaultSelector()
    for part in parts:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(part[0])
        # requests, the next one's index, bytes read, when the one in flight was written
        select.register(sock, selectors.EVENT_READ, [part, 1, b"", time.monotonic()])
    while select.get_map():
        for key, _ in select.select():
            sock, state = cast(socket.socket, key.fileobj), key.data
            state[2] += sock.recv(65536)
            head, found, rest = state[2].partition(b"\r\n\r\n")
            if not found:
                continue
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(rest) < length:
                continue
            now = time.monotonic()
            codes.append(int(head.split(b" ", 2)[1]))
            took.append(now - state[3])
            state[2] = rest[length:]
            part, following = state[0], state[1]
            if following < len(part):
                sock.sendall(part[following])
                state[1], state[3] = following + 1, now
            else:
                select.unregister(sock)
                sock.close()
    return codes, took


def _spread(requests: list[bytes], connections: int) -> list[list[bytes]]:
    """``requests`` (two per message) over ``connections``, whole messages each, in order: a
    message's ``sent`` before its ``delivered``."""
    parts: list[list[bytes]] = [[] for _ in range(connections)]
    for n in range(0, len(requests), 2):
        parts[(n // 2) % connections].extend(requests[n : n + 2])
    return parts


def receiver_run(engine: Any, keys: list[str]) -> dict[int, dict[str, Any]]:
    """Start the receiver on the bench outbox and POST every receipt: the first ``WARM_UP``
    messages' to warm it up, then half the rest over each of ``CONNECTIONS``; per load."""
    config = CONFIG.parent / "receipts.toml"
    stub = 'kind = "http"\n'
    config.write_text(
        CONFIG.read_text().replace(stub, stub + 'receipt_secret_env = "BENCH_RECEIPTS"\n', 1)
    )
    port = free_port()
    env = {**os.environ, "DELIVERY_CONFIG": str(config), "BENCH_RECEIPTS": SECRET}
    proc = ServiceProcess(
        "receiver",
        [sys.executable, "-m", "delivery.cli", "receiver", "--port", str(port)],
        log=CONFIG.parent / "receiver.log",
        ready="delivery receiver on",
        env=env,
    ).start()
    monitor = make_engine(PG_URL, pool_size=1, max_overflow=0)
    every = [request("/receipts/stub", body, headers) for body, headers in signed_receipts(keys)]
    # The first WARM_UP messages' receipts warm the receiver up, untimed (as end_to_end's
    # backlog runs warm the pipeline up): its processes' pools, writers and prepared statements.
    warm, work = every[: 2 * WARM_UP], every[2 * WARM_UP :]
    share = len(work) // len(CONNECTIONS) // 2 * 2  # whole messages per load
    loads: dict[int, dict[str, Any]] = {}
    answers: list[int] = []
    try:
        meter = CpuMeter(
            {
                "receiver": lambda: [proc.pid, *children(proc.pid)],
                "postgres": lambda: database_backends(monitor),
            }
        )
        answers += post_all(port, _spread(warm, len(warm) // 2))[0]
        for n, connections in enumerate(CONNECTIONS):
            load = work[n * share : (n + 1) * share if n + 1 < len(CONNECTIONS) else None]
            loads[connections] = _load(port, _spread(load, connections), meter, answers)
    finally:
        proc.stop()
        monitor.dispose()
    with engine.connect() as conn:
        stored = conn.scalar(select(func.count()).select_from(Receipt))
        delivered = conn.scalar(
            text("SELECT count(*) FROM delivery_messages WHERE status = 'delivered'")
        )
    assert set(answers) == {200}, sorted(set(answers))
    assert stored == len(every) and delivered == len(keys), (stored, delivered)
    return loads


def _load(port: int, parts: list[list[bytes]], meter: CpuMeter, answers: list[int]) -> Any:
    """One load's figures: receipts/s, answer p50/p99 (ms), CPU ms per receipt."""
    load = os.getloadavg()
    receipts = sum(len(part) for part in parts)
    meter.start()
    started, client = time.monotonic(), time.process_time()
    codes, took = post_all(port, parts)
    client = time.process_time() - client  # this process: the load generator alone
    seconds = time.monotonic() - started
    cpu = meter.stop()
    answers += codes
    return {
        "rate": round(receipts / seconds, 1),
        "seconds": round(seconds, 3),
        "receipts": receipts,
        "answer_ms": {f"p{q}": round(percentile(took, q) * 1000, 1) for q in (50, 99)},
        "cpu_ms_per_receipt": {
            k: round(v * 1000 / receipts, 3) for k, v in {**cpu, "client": client}.items()
        },
        "load": [round(x, 2) for x in load],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=8000)
    parser.add_argument("--pairs", type=int, default=3, help="pipeline/receiver runs, in turn")
    args = parser.parse_args()
    runs = {run[0]: run for run in BACKLOG_RUNS}
    pairs: list[dict[str, Any]] = []
    with session() as procs:
        engine = fresh_database()
        stub = procs.stub()
        stub_pid = procs.pids()[-1]
        for n in range(args.pairs):
            log(f"pair {n + 1}: pipeline, backlog of {args.messages}, prefork x2")
            pipeline = backlog_run(
                engine,
                procs,
                stub,
                stub_pid,
                run=runs["batch"],
                pool="prefork",
                concurrency=2,
                messages=args.messages,
            )
            log(f"  {pipeline}")
            with engine.connect() as conn:
                keys = list(conn.scalars(text("SELECT key FROM delivery_messages ORDER BY id")))
            log(f"pair {n + 1}: receiver, {2 * len(keys)} receipts, {CONNECTIONS} connections")
            received = receiver_run(engine, keys)
            log(f"  {received}")
            pairs.append({"pipeline": pipeline, "receiver": received})
        delivered = median([p["pipeline"]["rate"] for p in pairs])
        few, many = CONNECTIONS
        stored = {c: median([p["receiver"][c]["rate"] for p in pairs]) for c in CONNECTIONS}
        ratio = stored[many] / delivered
        last = pairs[-1]["receiver"]

        def each(connections: int) -> str:
            return ", ".join(f"{p['receiver'][connections]['rate']:,.0f}" for p in pairs)

        rows = [
            row(
                f"receipts stored per second by `delivery receiver` (Granian, its defaults; "
                f"{many} keep-alive connections, two signed receipts per message) vs the "
                f"pipeline's delivered/s (prefork x2 backlog); medians of {len(pairs)} pairs",
                ratio,
                ">= 3x",
                ratio >= 3.0,
                f"{stored[many]:,.0f} receipts/s ({each(many)}), answers "
                f"{last[many]['answer_ms']} ms, CPU ms per receipt "
                f"{last[many]['cpu_ms_per_receipt']} (load "
                f"{[p['receiver'][many]['load'][0] for p in pairs]}); on {few} connections "
                f"{stored[few]:,.0f} ({each(few)}), answers {last[few]['answer_ms']} ms",
                "pipeline {:,.0f} msg/s ({}) (load {})".format(
                    delivered,
                    ", ".join(f"{p['pipeline']['rate']:,.0f}" for p in pairs),
                    [p["pipeline"]["load"][0] for p in pairs],
                ),
            )
        ]
        figures = {"messages": args.messages, "pairs": pairs}
        report("receipts", figures, rows, engine)
        engine.dispose()


if __name__ == "__main__":
    main()
