"""End to end the README's way: an app that imports the Celery app (``import delivery.worker``:
the post-commit nudge on) commits 3,000 messages in one SQLAlchemy transaction, one
``delivery.enqueue(session, ...)`` per message, on an engine made as the README's app makes it
(``create_engine(delivery.get_settings().database_url)``); ``celery -A delivery.worker`` worker
(prefork x2) and beat, every ``delivery`` setting at its default. Next to it, in the same run
and on the same worker pool, Celery alone: the same business rows committed, then
``apply_async`` for each message after the commit. Both workers start as every benchmark's do
(``bench.run_worker``: logging at WARNING, no gossip, mingle or heartbeat).

Each message has its business row (``bench_orders``), flushed once for the ids its key is
made of (``delivery.key``). The clock runs from the first ``enqueue`` (Celery alone: the same
point of its transaction, after the flush) to the stub provider's last accept; delivered per
second = messages / that time. The app is done when its commit (and the nudge in it)
returned; Celery alone's, when its last ``apply_async`` did. Each run starts new processes
after a 100-message warm-up and checks that every key took effect once
(``bench.end_to_end.backlog_run``, which also splits the CPU per delivered message per
process: worker and its pool children, PostgreSQL backends, beat, app). The two paths
alternate over ``--rounds`` pairs (3: the ratio is of their medians), each run with the load
average at its start.

    python -m bench.app_way [--messages 3000] [--pool prefork:2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import delivery
from bench.common import CONFIG, Order, fresh_database, log, report, row, session
from bench.end_to_end import _median_run, _split, backlog_run, produce_alone, to

# The README's app ("Send from your app") imports delivery.worker, which installs the nudge and
# reads the settings: after bench.common, which points DELIVERY_* at this slot.
from delivery import worker  # noqa: F401  isort: skip

#: (label, path, configuration, task events), as ``backlog_run`` takes them.
RUNS = {
    "alone": ("alone", "alone", None, True),
    "delivery": ("delivery", "delivery", CONFIG, True),
}


def produce_readme(engine: Any, n: int, prefix: str) -> float:
    """``n`` business rows and their messages in one transaction, as the README's app writes
    one; return when the first ``enqueue`` was called. Commit runs the nudge."""
    with Session(engine) as s, s.begin():
        orders = [Order(ref=f"{prefix}-{i}", amount=i) for i in range(n)]
        s.add_all(orders)
        s.flush()  # gives the orders their ids, for the keys
        started = time.time()
        for i, order in enumerate(orders):
            delivery.enqueue(
                s,
                channel="sms",
                to=to(i),
                payload={"body": f"code {i}"},
                key=delivery.key(prefix, order.id, "sms"),
            )
    return started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--pool", default="prefork:2", help="POOL:CONCURRENCY of both workers")
    parser.add_argument("--rounds", type=int, default=3, help="alternating pairs (odd)")
    args = parser.parse_args()
    pool, concurrency = args.pool.split(":")[0], int(args.pool.split(":")[1])
    app_engine = create_engine(delivery.get_settings().database_url)  # the README's engine

    def readme(_: Any, n: int, prefix: str) -> float:
        return produce_readme(app_engine, n, prefix)

    def alone(_: Any, n: int, prefix: str) -> float:
        return produce_alone(app_engine, n, prefix, n)

    produce = {"alone": alone, "delivery": readme}
    what = f"{args.messages:,} messages in one app transaction, {pool} x{concurrency}"
    done: dict[str, list[dict[str, Any]]] = {"alone": [], "delivery": []}
    with session() as procs:
        engine = fresh_database()
        stub = procs.stub()
        stub_pid = procs.pids()[-1]
        for r in range(args.rounds):
            for name in ("alone", "delivery") if r % 2 == 0 else ("delivery", "alone"):
                log(f"{what}: {name} (round {r + 1} of {args.rounds})")
                result = backlog_run(
                    engine,
                    procs,
                    stub,
                    stub_pid,
                    run=RUNS[name],
                    pool=pool,
                    concurrency=concurrency,
                    messages=args.messages,
                    produce=produce[name],
                )
                log(f"  {result}")
                done[name].append(result)
        ours, base = _median_run(done["delivery"]), _median_run(done["alone"])
        pairs = ", ".join(
            f"{d:,.0f}/{a:,.0f}" for d, a in zip(ours["rounds"], base["rounds"], strict=True)
        )

        def timing(result: dict[str, Any]) -> str:
            return (
                f"{result['seconds']:.2f} s to the last effect (app done at "
                f"{result['app_seconds']:.2f} s, first effect at "
                f"{result['first_accept_seconds']:.2f} s)"
            )

        ratio = ours["rate"] / base["rate"]
        cpu = ours["cpu_ms_total"] / base["cpu_ms_total"]
        rows = [
            row(
                f"end to end the README's way (enqueue per message, nudge on), {what} "
                f"(median of {args.rounds} alternating pairs)",
                ratio,
                ">= 1.5x (aim 2.5x)",
                ratio >= 1.5,
                f"{_split(ours)}; {timing(ours)}; rounds delivery/alone msg/s {pairs}",
                f"Celery alone {_split(base)}; {timing(base)}",
            ),
            row(
                f"CPU per delivered message, all processes, the README's way, {what}",
                cpu,
                "<= 1.0x",
                cpu <= 1.0,
                f"delivery {ours['cpu_ms_total']:.2f} ms",
                f"Celery alone {base['cpu_ms_total']:.2f} ms",
            ),
        ]
        figures = {
            "messages": args.messages,
            "pool": f"{pool}:{concurrency}",
            "rounds": args.rounds,
            "delivery": ours,
            "alone": base,
            "runs": done,
        }
        report("app_way", figures, rows, engine)
        engine.dispose()
    app_engine.dispose()


if __name__ == "__main__":
    main()
