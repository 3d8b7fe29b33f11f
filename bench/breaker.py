"""Circuit breaker: throughput against a provider that mostly works, and provider requests
during a full outage, each next to a run with the breaker disabled, in the same session.

Every run has a fresh outbox and Redis, one worker (threads, 8) and beat, default backoff
(base 1 s, cap 300 s), 8 attempts and the **default** breaker (``with``) or ``enabled = false``
(``without``):

- ``lost``: ``--messages`` (1,000) due messages while the stub drops 30% of its answers after
  accepting (unknown outcomes, retried with the same key); messages/s until 90% are final (the
  rest wait out backoff delays, the same with the breaker and without), and the full drain.
- ``503``: the same with 15% of the requests answered 503.
- ``outage``: ``--outage-messages`` (200) due messages while the stub answers every POST 503
  for ``--outage`` s (60); provider requests during the outage, drain time after it.
- ``backlog``: the same for a backlog that travels in batches: ``--backlog-messages`` (100)
  due at once, every POST 503 for ``--backlog-outage`` s (15), ``reset_timeout =
  --backlog-reset`` (5); the requests during the outage against the breaker's bound, 10 to
  trip + one per worker slot (task threads + send pool) + 3 probes per reset_timeout.

The load average (``/proc/loadavg``) is taken before and after each run and kept with the
figures. The rows go to the table of ``bench/README.md`` and to the ``Hardening`` table of
``bench/RELIABILITY.md``.

    python -m bench.breaker [--messages 1000] [--outage-messages 200] [--outage 60]
    python -m bench.breaker --messages 300 --outage-messages 100 --outage 20   # a quick run
    python -m bench.breaker --only backlog                # the backlog outage alone
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.common import (
    CONFIG,
    RUN_DIR,
    flush_redis,
    fresh_database,
    insert_rows,
    log,
    reliability_row,
    report,
    row,
    session,
    truncate,
)

THREADS = 8
FAULTS: dict[str, dict[str, Any]] = {
    "lost": {"drop_rate": 0.3},
    "503": {"error_rate": 0.15, "error_status": 503},
    "outage": {"error_rate": 1.0, "error_status": 503},
    "backlog": {"error_rate": 1.0, "error_status": 503},
}
SCENARIOS = tuple(FAULTS)
#: Sends in flight at once in the bench's worker: each task thread sends a message alone, a
#: batch's sends go on the send pool (``send_concurrency``, 8 by default).
SLOTS = THREADS + 8


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _config(enabled: bool, reset: float | None = None) -> str:
    path = RUN_DIR / f"breaker-{'with' if enabled else 'without'}-{reset}.toml"
    table = f"\n[providers.stub.breaker]\nenabled = {'true' if enabled else 'false'}\n"
    path.write_text(
        CONFIG.read_text() + table + ("" if reset is None else f"reset_timeout = {reset}\n")
    )
    return str(path)


def _final(engine: Any) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM delivery_messages GROUP BY status"))
        return {str(status): int(n) for status, n in rows}


def _drain(engine: Any, n: int, timeout: float) -> tuple[dict[str, int], bool, float | None]:
    """Wait until all ``n`` messages are final; the counts, whether they all are, and when
    (epoch seconds) 90% of them were."""
    deadline = time.monotonic() + timeout
    t90 = None
    while True:
        counts = _final(engine)
        final = sum(counts.get(s, 0) for s in ("sent", "dead", "unknown"))
        if t90 is None and final >= 0.9 * n:
            t90 = time.time()
        if final == n or time.monotonic() > deadline:
            return counts, final == n, t90
        time.sleep(0.1)


def run(
    engine: Any, procs: Any, stub: Any, scenario: str, enabled: bool, args: argparse.Namespace
) -> dict[str, Any]:
    mode = "with" if enabled else "without"
    truncate(engine)
    flush_redis()
    stub.reset()
    stub.set_faults(seed=42, **FAULTS[scenario])
    backlog = scenario == "backlog"
    os.environ["DELIVERY_CONFIG"] = _config(enabled, args.backlog_reset if backlog else None)
    worker = procs.worker(concurrency=THREADS, name=f"breaker-{scenario}-{mode}")
    beat = procs.beat()
    load_before = loadavg()
    n = {"outage": args.outage_messages, "backlog": args.backlog_messages}.get(
        scenario, args.messages
    )
    outage = args.backlog_outage if backlog else args.outage
    try:
        started = time.time()
        insert_rows(engine, n, prefix=f"breaker-{scenario}-{mode}", due_seconds_ago=0.0)
        if scenario in ("outage", "backlog"):
            log(f"{scenario} {mode}: {n} messages queued, provider down for {outage:g} s")
            time.sleep(max(0.0, started + outage - time.time()))
            stub.set_faults(error_rate=0.0)
            recovered = time.time()
            counts, done, t90 = _drain(engine, n, args.drain_timeout)
        else:
            log(f"{scenario} {mode}: {n} messages queued")
            recovered = started
            counts, done, t90 = _drain(engine, n, args.drain_timeout)
        finished = time.time()
    finally:
        procs.stop(beat)
        procs.stop(worker)
    requests = stub.requests()
    result = {
        "messages": n,
        "seconds": round(finished - started, 2),
        "seconds_to_90pct": None if t90 is None else round(t90 - started, 2),
        # The first 90%: the last messages wait out backoff delays that have nothing to do
        # with the breaker (the same with it and without) and would only add noise.
        "msg_per_s": 0.0 if t90 is None else round(0.9 * n / max(t90 - started, 1e-9), 1),
        "requests": len(requests),
        "sent": counts.get("sent", 0),
        "dead": counts.get("dead", 0),
        "drained": done,
        "loadavg": f"{load_before} -> {loadavg()}",
    }
    if scenario in ("outage", "backlog"):
        result["requests_during_outage"] = sum(
            1 for r in requests if started <= r["at"] < recovered
        )
        result["drain_s"] = round(finished - recovered, 1)
    log(f"{scenario} {mode}: {result}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--outage-messages", type=int, default=200)
    parser.add_argument("--outage", type=float, default=60.0)
    parser.add_argument("--backlog-messages", type=int, default=100)
    parser.add_argument("--backlog-outage", type=float, default=15.0)
    parser.add_argument("--backlog-reset", type=float, default=5.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--only", choices=SCENARIOS, action="append", help="these scenarios")
    args = parser.parse_args(argv)
    scenarios = args.only or SCENARIOS
    engine = fresh_database()
    results: dict[str, dict[str, Any]] = {}
    with session() as procs:
        stub = procs.stub()
        for scenario in scenarios:
            for enabled in (True, False):
                key = f"{scenario}_{'with' if enabled else 'without'}"
                results[key] = run(engine, procs, stub, scenario, enabled, args)
    figures = {
        "messages": args.messages,
        "outage_messages": args.outage_messages,
        "outage_s": args.outage,
        "backlog_messages": args.backlog_messages,
        "backlog_outage_s": args.backlog_outage,
        "backlog_reset_timeout": args.backlog_reset,
        "worker_threads": THREADS,
        **{f"{key}_{k}": v for key, r in results.items() for k, v in r.items()},
    }
    rows = [_row(scenario, results, args) for scenario in scenarios]
    report("breaker", figures, rows, engine)
    for r in rows:
        reliability_row(
            f"breaker: {r['metric']}",
            f"{r['delivery']}; ratio {r['ratio']}; target {r['target']}: "
            f"{'met' if r['met'] else 'MISSED'}",
            r["baseline"],
            "python -m bench.breaker",
        )
    engine.dispose()


def _row(scenario: str, results: dict[str, dict[str, Any]], args: argparse.Namespace) -> Any:
    on, off = results[f"{scenario}_with"], results[f"{scenario}_without"]
    if scenario == "backlog":
        bound = 10 + SLOTS + 3 * math.ceil(args.backlog_outage / args.backlog_reset)
        return row(
            f"provider requests during a {args.backlog_outage:g} s outage at the start of a "
            f"{args.backlog_messages}-message backlog (batches), default breaker with "
            f"reset_timeout = {args.backlog_reset:g} vs disabled",
            on["requests_during_outage"] / max(off["requests_during_outage"], 1),
            f"<= {bound} requests (10 + {SLOTS} slots + 3 x outage / reset_timeout)",
            on["requests_during_outage"] <= bound and on["drained"],
            f"{on['requests_during_outage']} requests, all sent {on['drain_s']} s after "
            f"(load {on['loadavg']})",
            f"{off['requests_during_outage']} disabled, final {off['drain_s']} s after "
            f"({off['sent']} sent, {off['dead']} dead; load {off['loadavg']})",
        )
    if scenario == "outage":
        return row(
            "provider requests during a full outage (every POST 503), default breaker vs disabled",
            on["requests_during_outage"] / max(off["requests_during_outage"], 1),
            "<= 20 requests",
            on["requests_during_outage"] <= 20,
            f"{on['requests_during_outage']} requests in {args.outage:g} s "
            f"({args.outage_messages} messages), all sent {on['drain_s']} s after "
            f"(load {on['loadavg']})",
            f"{off['requests_during_outage']} disabled, final {off['drain_s']} s after "
            f"({off['sent']} sent, {off['dead']} dead; load {off['loadavg']})",
        )
    what = {"lost": "30% of answers lost", "503": "15% 503s"}[scenario]
    ratio = on["msg_per_s"] / max(off["msg_per_s"], 1e-9)
    return row(
        f"messages/s with {what}, default breaker vs disabled",
        ratio,
        ">= 0.8x",
        ratio >= 0.8 and on["drained"],
        f"{on['msg_per_s']} msg/s ({args.messages:,} messages: {on['sent']} sent, "
        f"{on['requests']} requests, all final in {on['seconds']} s; "
        f"load {on['loadavg']})",
        f"{off['msg_per_s']} msg/s disabled ({off['sent']} sent, {off['requests']} "
        f"requests, all final in {off['seconds']} s; load {off['loadavg']})",
    )


if __name__ == "__main__":
    main()
