"""Circuit breaker: provider requests during an outage, with and without the breaker, and the
drain time after recovery.

``--messages`` (1,000) due messages are queued while the stub answers every POST with 503 for
``--outage`` seconds (60); then it recovers. Two runs, each on a fresh outbox and Redis, with
one worker (threads, 8) and beat, default backoff (base 1 s, cap 300 s) and 8 attempts:

- ``with``: the default breaker (5 failures in 60 s open it, ``--reset-timeout`` 30 s, 2 probe
  successes close it);
- ``without``: ``failure_threshold = 1000000000``, so the breaker never opens.

Measured: POSTs the stub received during the outage; drain time from recovery until every
message is final; how many ended ``sent`` and ``dead``.

    python -m bench.breaker [--messages 1000] [--outage 60] [--reset-timeout 30]
    python -m bench.breaker --messages 200 --outage 10 --reset-timeout 4   # a quick run
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from sqlalchemy import text

from bench.common import (
    CONFIG,
    RUN_DIR,
    flush_redis,
    fresh_database,
    insert_rows,
    log,
    report,
    row,
    session,
    truncate,
)

THREADS = 8


def _config(mode: str, reset_timeout: float) -> str:
    threshold = 5 if mode == "with" else 1_000_000_000
    path = RUN_DIR / f"breaker-{mode}.toml"
    path.write_text(
        CONFIG.read_text()
        + f"""
[providers.stub.breaker]
failure_threshold = {threshold}
window = 60
reset_timeout = {reset_timeout}
success_threshold = 2
"""
    )
    return str(path)


def _final(engine: Any) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM delivery_messages GROUP BY status"))
        return {str(status): int(n) for status, n in rows}


def run(engine: Any, procs: Any, stub: Any, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    truncate(engine)
    flush_redis()
    stub.reset()
    stub.set_faults(error_rate=1.0, error_status=503)
    os.environ["DELIVERY_CONFIG"] = _config(mode, args.reset_timeout)
    worker = procs.worker(concurrency=THREADS, name=f"breaker-{mode}")
    beat = procs.beat()
    try:
        started = time.time()
        insert_rows(engine, args.messages, prefix=f"breaker-{mode}", due_seconds_ago=0.0)
        log(f"{mode}: {args.messages} messages queued, provider down for {args.outage:g} s")
        time.sleep(max(0.0, started + args.outage - time.time()))
        stub.set_faults(error_rate=0.0)
        recovered = time.time()
        during = sum(1 for r in stub.requests() if started <= r["at"] < recovered)
        log(f"{mode}: provider back; {during} requests during the outage")
        deadline = time.monotonic() + args.drain_timeout
        while True:
            counts = _final(engine)
            final = sum(counts.get(s, 0) for s in ("sent", "dead", "unknown"))
            if final == args.messages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        drain = time.time() - recovered
    finally:
        procs.stop(beat)
        procs.stop(worker)
    after = sum(1 for r in stub.requests() if r["at"] >= recovered)
    log(f"{mode}: drained in {drain:.1f} s: {counts}")
    return {
        "requests_during_outage": during,
        "requests_after_recovery": after,
        "drain_s": round(drain, 1),
        "drained": final == args.messages,
        "sent": counts.get("sent", 0),
        "dead": counts.get("dead", 0),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--outage", type=float, default=60.0)
    parser.add_argument("--reset-timeout", type=float, default=30.0)
    parser.add_argument("--drain-timeout", type=float, default=400.0)
    args = parser.parse_args(argv)
    engine = fresh_database()
    with session() as procs:
        stub = procs.stub()
        results = {mode: run(engine, procs, stub, mode, args) for mode in ("with", "without")}
    on, off = results["with"], results["without"]
    bound = 5 + THREADS + int(args.outage // args.reset_timeout) + 1
    figures = {
        "messages": args.messages,
        "outage_s": args.outage,
        "reset_timeout_s": args.reset_timeout,
        "worker_threads": THREADS,
        **{f"{mode}_{k}": v for mode, r in results.items() for k, v in r.items()},
    }
    what = f"{args.messages:,} queued, {args.outage:g} s of 503s"

    def show(r: dict[str, Any]) -> str:
        return f"{r['sent']} sent, {r['dead']} dead"

    rows = [
        row(
            f"provider requests during the outage ({what})",
            on["requests_during_outage"] / max(off["requests_during_outage"], 1),
            f"<= threshold + in flight + 1 per reset_timeout ({bound})",
            on["requests_during_outage"] <= bound,
            f"{on['requests_during_outage']:,} requests with the breaker",
            f"{off['requests_during_outage']:,} without",
        ),
        row(
            f"drain after recovery ({what})",
            on["drain_s"] / max(off["drain_s"], 0.1),
            "",
            None,
            f"{on['drain_s']} s with the breaker ({show(on)})",
            f"{off['drain_s']} s without ({show(off)})",
        ),
    ]
    report("breaker", figures, rows, engine)
    engine.dispose()


if __name__ == "__main__":
    main()
