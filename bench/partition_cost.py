"""Partition cost (issue 29): what an outbox partitioned by day costs ``enqueue`` against one
that is not, in the same run.

Two databases, one of each shape, each emptied before a block. ``enqueue``: the app's
transaction of ``bench.enqueue_cost`` (``Session`` + ``begin`` + ``add(Order)`` + ``enqueue``
+ ``commit``, the nudge off), in blocks of ``--block`` alternating between the shapes for
``--rounds`` rounds, median time per transaction. On the partitioned outbox each insert also
claims its key in ``delivery_keys`` (a trigger); its id's day names its partition.
``enqueue_many``: ``--many`` messages in one transaction, rows/s, 3 alternating rounds.

    python -m bench.partition_cost [--rounds 10] [--block 200] [--many 10000]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from sqlalchemy.orm import Session

from bench.common import PG_DB, fresh_database, in_turn, log, median, report, row, truncate
from bench.enqueue_cost import Counter, shipped, transaction
from delivery import enqueue_many
from delivery.outbox import enqueue as outbox

SHAPES = ("partitioned", "unpartitioned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--many", type=int, default=10_000)
    args = parser.parse_args()
    outbox.set_nudge(None)
    engines = {
        "partitioned": fresh_database(),
        "unpartitioned": fresh_database(f"{PG_DB}_flat", partition=False),
    }
    counters = {shape: Counter(engine) for shape, engine in engines.items()}
    times: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    loads = []
    i = 0
    for round_ in range(args.rounds):
        for shape in in_turn(SHAPES, round_):
            truncate(engines[shape])
            for _ in range(args.block):
                i += 1
                elapsed, _, _ = transaction(engines[shape], i, shipped, counters[shape])
                times[shape].append(elapsed)
        loads.append(os.getloadavg()[0])
        log(
            f"round {round_}: "
            + ", ".join(f"{s} {median(t) * 1e6:.0f} us" for s, t in times.items())
        )
    many: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for round_ in range(3):
        for shape in in_turn(SHAPES, round_):
            truncate(engines[shape])
            spec = (
                dict(channel="sms", to="+12015550123", payload={"body": f"c {n}"}, key=f"m-{n}")
                for n in range(args.many)
            )
            started = time.perf_counter()
            with Session(engines[shape]) as session, session.begin():
                enqueue_many(session, spec)
            many[shape].append(args.many / (time.perf_counter() - started))
            log(f"enqueue_many {shape}: {many[shape][-1]:,.0f} rows/s")
    figures: dict[str, Any] = {
        "enqueue_us": {s: round(median(t) * 1e6, 1) for s, t in times.items()},
        "enqueue_many_rows_per_s": {s: round(median(r), 1) for s, r in many.items()},
        "load": [round(min(loads), 2), round(max(loads), 2)],
    }
    load = f"load {min(loads):.2f}-{max(loads):.2f}"
    us, rates = figures["enqueue_us"], figures["enqueue_many_rows_per_s"]
    rows = [
        row(
            "`enqueue` in an app transaction (business row + enqueue + commit), partitioned "
            "by day vs not",
            us["partitioned"] / us["unpartitioned"],
            "unchanged within noise (<= 1.1x)",
            us["partitioned"] / us["unpartitioned"] <= 1.1,
            f"{us['partitioned']:.0f} us per transaction ({load})",
            f"{us['unpartitioned']:.0f} us",
        ),
        row(
            f"`enqueue_many` of {args.many:,} in one transaction, partitioned by day vs not",
            rates["partitioned"] / rates["unpartitioned"],
            ">= 0.9x",
            rates["partitioned"] / rates["unpartitioned"] >= 0.9,
            f"{rates['partitioned']:,.0f} rows/s",
            f"{rates['unpartitioned']:,.0f} rows/s",
        ),
    ]
    report("partition_cost", figures, rows, engines["partitioned"])


if __name__ == "__main__":
    main()
