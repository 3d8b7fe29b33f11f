"""Latency: at a steady 50 messages/s, the time from the app's commit to the provider's accept,
p50 and p99, with the post-commit nudge and without it (then the beat relay, ticking every
``relay_interval`` = 1 s, publishes the rows).

Each message is one app transaction (one business row + ``enqueue``), started on a fixed
schedule (every 20 ms). The clock starts when the app calls ``commit()`` (so it includes the
commit itself and the nudge that runs inside it) and stops at the stub's arrival time of the
request (``GET /_stub/requests``; same host, same clock). Worker: threads pool x8, plus beat.

    python -m bench.latency [--rate 50] [--seconds 20] [--pool threads:8]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from bench.common import (
    Order,
    fresh_database,
    log,
    percentile,
    report,
    row,
    session,
    truncate,
    wait_until,
)
from delivery import enqueue
from delivery.outbox import enqueue as outbox
from delivery.worker import app as _tasks  # noqa: F401  (after bench.common: installs the nudge here)


def steady(
    engine: Any, rate: float, count: int, prefix: str
) -> tuple[dict[str, float], list[float]]:
    """Commit ``count`` messages at ``rate``/s; return commit times by key and commit spans."""
    committed: dict[str, float] = {}
    spans: list[float] = []
    interval = 1.0 / rate
    start = time.monotonic() + 0.1
    for i in range(count):
        pause = start + i * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        key = f"{prefix}-{i}"
        s = Session(engine)
        try:
            s.begin()
            s.add(Order(ref=key, amount=i))
            enqueue(s, channel="sms", to=f"+1201555{i % 10000:04d}", payload={"body": "x"}, key=key)
            at = time.time()
            began = time.perf_counter()
            s.commit()
            spans.append(time.perf_counter() - began)
            committed[key] = at
        finally:
            s.close()
    return committed, spans


def _attempts(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(text("SELECT count(*) FROM delivery_attempts")) or 0)


def measure(engine: Any, stub: Any, rate: float, count: int, prefix: str) -> dict[str, Any]:
    truncate(engine)
    stub.reset()
    committed, spans = steady(engine, rate, count, prefix)
    wait_until(lambda: len(stub.effects()) >= count, 120, 0.25, f"{count} effects")
    accepted: dict[str, float] = {}
    for r in stub.requests():
        if r["outcome"] == "effect":
            accepted.setdefault(r["key"], r["at"])
    latencies = [(accepted[k] - t) * 1000.0 for k, t in committed.items()]
    # Where the time goes: commit -> the worker starts its POST (the attempt's started_at).
    wait_until(lambda: _attempts(engine) >= count, 30, 0.1, "attempt rows")
    with engine.connect() as conn:
        started = {
            key: at.timestamp()
            for key, at in conn.execute(
                text(
                    "SELECT m.key, min(a.started_at) FROM delivery_attempts a "
                    "JOIN delivery_messages m ON m.id = a.message_id GROUP BY m.key"
                )
            )
        }
    to_post = [(started[k] - t) * 1000.0 for k, t in committed.items()]
    return {
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "max_ms": round(max(latencies), 2),
        "commit_to_post_p50_ms": round(percentile(to_post, 50), 2),
        "commit_to_post_p99_ms": round(percentile(to_post, 99), 2),
        "commit_p50_ms": round(percentile([s * 1000 for s in spans], 50), 2),
        "commit_p99_ms": round(percentile([s * 1000 for s in spans], 99), 2),
        "messages": count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--pool", default="threads:8")
    args = parser.parse_args()
    pool, concurrency = args.pool.split(":")
    count = int(args.rate * args.seconds)
    nudge = outbox._nudge
    with session() as procs:
        engine = fresh_database()
        stub = procs.stub()
        procs.worker("delivery.worker", pool=pool, concurrency=int(concurrency), name="latency")
        procs.beat()
        log("warm-up")
        measure(engine, stub, args.rate, 50, "warm")
        log(f"with the nudge: {count} messages at {args.rate}/s")
        with_nudge = measure(engine, stub, args.rate, count, "nudge")
        log(f"  {with_nudge}")
        outbox.set_nudge(None)
        try:
            log("without the nudge")
            without = measure(engine, stub, args.rate, count, "relay")
            log(f"  {without}")
        finally:
            outbox.set_nudge(nudge)
        figures = {"rate": args.rate, "pool": args.pool, "nudge": with_nudge, "no_nudge": without}
        rows = [
            row(
                f"commit -> accept p50, nudge, {args.rate:g} msg/s",
                None,
                "<= 20 ms",
                with_nudge["p50_ms"] <= 20,
                f"{with_nudge['p50_ms']} ms",
                f"without nudge {without['p50_ms']} ms",
            ),
            row(
                f"commit -> accept p99, nudge, {args.rate:g} msg/s",
                None,
                "<= 100 ms",
                with_nudge["p99_ms"] <= 100,
                f"{with_nudge['p99_ms']} ms (commit call p99 {with_nudge['commit_p99_ms']} ms, "
                f"commit -> worker POST p99 {with_nudge['commit_to_post_p99_ms']} ms)",
                f"without nudge {without['p99_ms']} ms",
            ),
        ]
        report("latency", figures, rows, engine)
        engine.dispose()


if __name__ == "__main__":
    main()
