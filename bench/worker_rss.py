"""Worker memory: resident set size of a ``delivery.worker`` worker after 1,000 and after 5,000
delivered messages, and its peak (``VmHWM``), for the threads pool (the worker process
itself) and the prefork pool (its pool processes: the largest child is reported).

Messages are enqueued in transactions of 100 (the nudge publishes them); the readings are
taken from /proc when the stub has accepted 1,000, then 5,000 of them. Growth between the
two readings must stay within 10%.

    python -m bench.worker_rss [--messages 5000] [--pools threads:8,prefork:4]
"""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.orm import Session

from bench.common import (
    children,
    fresh_database,
    log,
    proc_memory,
    report,
    row,
    session,
    truncate,
    wait_until,
)
from delivery import enqueue
from delivery.worker import app as _tasks  # noqa: F401  (after bench.common: installs the nudge here)


def produce(engine: Any, start: int, stop: int) -> None:
    for first in range(start, stop, 100):
        with Session(engine) as s, s.begin():
            for i in range(first, min(first + 100, stop)):
                enqueue(
                    s,
                    channel="sms",
                    to=f"+1201555{i % 10000:04d}",
                    payload={"body": f"code {i}"},
                    key=f"rss-{i}",
                )


def reading(pid: int, pool: str) -> dict[str, int]:
    """KiB: the worker process (threads) or its largest pool process (prefork)."""
    if pool == "prefork":
        kids = [proc_memory(c) for c in children(pid)]
        return {"VmRSS": max(k["VmRSS"] for k in kids), "VmHWM": max(k["VmHWM"] for k in kids)}
    return proc_memory(pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--first", type=int, default=1000)
    parser.add_argument("--pools", default="threads:8,prefork:4")
    args = parser.parse_args()
    figures: dict[str, Any] = {"first": args.first, "messages": args.messages}
    rows = []
    with session() as procs:
        engine = fresh_database()
        stub = procs.stub()

        def total() -> int:
            return int(stub._http.get("/_stub/effects").json()["total"])

        for spec in args.pools.split(","):
            pool, concurrency = spec.split(":")
            truncate(engine)
            stub.reset()
            worker = procs.worker(
                "delivery.worker", pool=pool, concurrency=int(concurrency), name="rss"
            )
            try:
                produce(engine, 0, args.first)
                wait_until(lambda: total() >= args.first, 300, 0.25, f"{args.first} effects")
                at_first = reading(worker.pid, pool)
                log(f"{spec} after {args.first}: {at_first}")
                produce(engine, args.first, args.messages)
                wait_until(lambda: total() >= args.messages, 600, 0.25, "all effects")
                at_end = reading(worker.pid, pool)
                log(f"{spec} after {args.messages}: {at_end}")
            finally:
                procs.stop(worker)
            growth = at_end["VmHWM"] / at_first["VmHWM"] - 1
            figures[spec] = {"after_first_kib": at_first, "after_all_kib": at_end}
            rows.append(
                row(
                    f"worker peak RSS growth {args.first:,} -> {args.messages:,} msgs, "
                    f"{pool} x{concurrency}",
                    1 + growth,
                    "<= 1.10x",
                    growth <= 0.10,
                    f"{at_end['VmHWM'] / 1024:.1f} MiB peak after {args.messages:,} "
                    f"(RSS {at_end['VmRSS'] / 1024:.1f} MiB)",
                    f"{at_first['VmHWM'] / 1024:.1f} MiB peak after {args.first:,} "
                    f"(RSS {at_first['VmRSS'] / 1024:.1f} MiB)",
                )
            )
        report("worker_rss", figures, rows, engine)
        engine.dispose()


if __name__ == "__main__":
    main()
