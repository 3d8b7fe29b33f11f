"""Retention (issue 29): what ``delivery prune`` costs on a large outbox, and what space it
gives back, on an outbox partitioned by day against one that is not, in the same run.

Each shape gets a database of its own and the same outbox: ``--messages`` (2,000,000) spread
over the last 20 days (``delivery.testing.fill``: mostly ``sent``, some ``dead`` and
``unknown``; its ``pending`` ones older than a day made ``sent``, as a live outbox's are),
each with one attempt row. The partitioned one is partitioned from 21 days ago (its rows
carry the ids of their days, as if inserted then). Then ``delivery prune --older-than 10d``
as a subprocess (as shipped), timed, with the tables' size before and after (PostgreSQL's
``pg_total_relation_size`` of messages and attempts, their partitions and indexes). On the
partitioned outbox the cutoff is rounded down to midnight: it prunes up to a day less.
Then the unpartitioned outbox (what its prune left) is converted with ``delivery db
partition``, timed, with how long its swap held the tables (the pipeline's one pause).

Last, prune at scale, as a daily prune finds a partitioned outbox: ``--scale`` (10,000,000)
``sent`` messages against 10,000, in two databases, each created (and last changed) evenly
from midnight ``KEEP + --rounds`` days ago to now (``bench.common.insert_rows``: one
statement, the keys claimed by the outbox's trigger). Round ``r`` runs ``delivery prune
--older-than (KEEP + rounds - 1 - r)d``, which drops that round's oldest whole day (a
thirty-first of each outbox), on both sizes in alternating order; the figure is the median
of the rounds' large / small ratios of the command's wall time, start-up included. Then
beat's pass deletes the dropped days' keys (``partitions.free_keys``), timed.

    python -m bench.retention [--messages 2000000] [--scale 10000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from typing import Any

from sqlalchemy import create_engine, text

from bench.common import (
    BROKER_URL,
    PG_DB,
    PG_SERVER,
    ROOT,
    fresh_database,
    in_turn,
    insert_rows,
    log,
    median,
    report,
    row,
    vacuum,
)
from delivery.runtime import conversion, partitions
from delivery.runtime.db import make_engine, upgrade
from delivery.testing.fill import fill_outbox

DAYS = 20
OLDER_THAN = "10d"
KEEP = 30  # days the scale figure's outboxes keep (``prune --older-than 30d``, once a day)
TABLES = ("delivery_messages", "delivery_attempts")
SHAPES = ("unpartitioned", "partitioned")
_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
WHERE c.oid = to_regclass(:t)
   OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(:t))
"""


def _size(engine: Any) -> int:
    with engine.connect() as conn:
        return sum(int(conn.scalar(text(_SIZE), {"t": t})) for t in TABLES)


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:,.0f} MB"


def _admin(sql: str) -> None:
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(sql))
    admin.dispose()


def _filled(name: str, shape: str, messages: int) -> Any:
    _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _admin(f"CREATE DATABASE {name}")
    engine = make_engine(f"{PG_SERVER}/{name}")
    upgrade(engine, partition=False)
    if shape == "partitioned":
        start = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=DAYS + 1)
        conversion.partition(engine, start=start)
    with engine.begin() as conn:
        fill_outbox(conn, messages, dt.timedelta(days=DAYS) / messages)
        conn.execute(
            text(
                "UPDATE delivery_messages SET status = 'sent' "
                "WHERE status = 'pending' AND created_at < now() - interval '1 day'"
            )
        )
        conn.execute(
            text(
                "INSERT INTO delivery_attempts (message_id, number, kind, provider, "
                "started_at, outcome, http_status) SELECT id, 1, 'send', provider, "
                "created_at, 'delivered', 201 FROM delivery_messages"
            )
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return engine


def _cli(name: str, *args: str) -> tuple[str, float]:
    """``delivery ARGS`` on database ``name``, as a user runs it: its output, its seconds."""
    env = {
        **os.environ,
        "DELIVERY_DATABASE_URL": f"{PG_SERVER}/{name}",
        "DELIVERY_BROKER_URL": BROKER_URL,
    }
    env.pop("DELIVERY_CONFIG", None)
    argv = [sys.executable, "-m", "delivery.cli", *args]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout, time.monotonic() - started


def _convert(name: str, engine: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        messages = int(conn.scalar(text("SELECT count(*) FROM delivery_messages")))
    load = os.getloadavg()
    out, seconds = _cli(name, "db", "partition")
    held = int(out.rsplit("held the outbox for ", 1)[1].split(" ms")[0])
    return {"messages": messages, "seconds": round(seconds, 1), "swap_ms": held, "load": load}


def _prune(name: str, engine: Any) -> dict[str, Any]:
    before = _size(engine)
    load = os.getloadavg()
    out, seconds = _cli(name, "prune", "--older-than", OLDER_THAN, "--json")
    pruned = json.loads(out)
    after = _size(engine)
    return {
        "messages": pruned["messages"],
        "attempts": pruned["attempts"],
        "days_dropped": len(pruned["days_dropped"]),
        "days_kept": pruned["days_kept"],
        "seconds": round(seconds, 2),
        "size_before": before,
        "size_after": after,
        "load": [round(x, 2) for x in load],
    }


def _said(f: dict[str, Any]) -> str:
    dropped = f" ({f['days_dropped']} days dropped)" if f["days_dropped"] else ""
    return (
        f"{f['messages']:,} messages{dropped} and {f['attempts']:,} attempts in "
        f"{f['seconds']:,.2f} s ({f['messages'] / f['seconds']:,.0f} messages/s); messages + "
        f"attempts {_mb(f['size_before'])} before, {_mb(f['size_after'])} after (load "
        f"{' '.join(f'{x:.2f}' for x in f['load'])})"
    )


def _scaled(name: str, messages: int, rounds: int) -> Any:
    """Database ``name``, partitioned, holding ``messages`` sent over whole days since
    midnight ``KEEP + rounds`` days ago and today so far."""
    now = dt.datetime.now(dt.UTC)
    start = now.date() - dt.timedelta(days=KEEP + rounds)
    engine = fresh_database(name, since=start)
    midnight = dt.datetime.combine(start, dt.time(), tzinfo=dt.UTC)
    span = (now - midnight).total_seconds() / 86400
    insert_rows(engine, messages, status="sent", prefix="old", due_seconds_ago=0, days=span)
    vacuum(engine)
    return engine


def _scale(messages: int, rounds: int) -> dict[str, Any]:
    """Prune at ``messages`` against 10,000, alternating, ``rounds`` days one by one."""
    sizes = {"small": 10_000, "large": messages}
    names = {size: f"{PG_DB}_retention_{size}" for size in sizes}
    engines = {}
    for size, count in sizes.items():
        log(f"scale: {count:,} messages over {KEEP + rounds} days and today")
        engines[size] = _scaled(names[size], count, rounds)
    runs: dict[str, list[dict[str, Any]]] = {size: [] for size in sizes}
    try:
        for number in range(rounds):
            older = f"{KEEP + rounds - 1 - number}d"
            for size in in_turn(sizes, number):
                load = os.getloadavg()
                out, seconds = _cli(names[size], "prune", "--older-than", older, "--json")
                pruned = json.loads(out)
                runs[size].append(
                    {
                        "older_than": older,
                        "messages": pruned["messages"],
                        "days_dropped": pruned["days_dropped"],
                        "seconds": round(seconds, 3),
                        "load": round(load[0], 2),
                    }
                )
                log(f"  round {number + 1} {size}: {runs[size][-1]}")
        freed = {}
        for size, engine in engines.items():  # what beat's hourly pass does after
            started = time.monotonic()
            keys = partitions.free_keys(engine)
            freed[size] = {"keys": keys, "seconds": round(time.monotonic() - started, 3)}
            log(f"  {size}: beat's pass freed {keys:,} keys in {freed[size]['seconds']} s")
    finally:
        for size, engine in engines.items():
            engine.dispose()
            _admin(f"DROP DATABASE IF EXISTS {names[size]} WITH (FORCE)")
    ratios = [
        big["seconds"] / small["seconds"]
        for small, big in zip(runs["small"], runs["large"], strict=True)
    ]
    return {"sizes": sizes, "runs": runs, "ratios": [round(r, 3) for r in ratios], "freed": freed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--scale", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="days pruned one by one")
    args = parser.parse_args()
    figures: dict[str, Any] = {"messages": args.messages}
    for shape in SHAPES:
        name = f"{PG_DB}_retention_{shape}"
        log(f"{shape}: filling {args.messages:,} messages over {DAYS} days, one attempt each")
        started = time.monotonic()
        engine = _filled(name, shape, args.messages)
        log(f"  filled in {time.monotonic() - started:.0f} s; delivery prune --older-than 10d")
        try:
            figures[shape] = _prune(name, engine)
            if shape == "unpartitioned":
                log("  delivery db partition on what is left")
                figures["conversion"] = _convert(name, engine)
        finally:
            engine.dispose()
            _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        log(f"  {_said(figures[shape])}")
    new, old = figures["partitioned"], figures["unpartitioned"]
    rows = [
        row(
            f"`delivery prune --older-than {OLDER_THAN}` on {args.messages:,} messages over "
            f"{DAYS} days (one attempt each): partitioned by day vs not",
            old["seconds"] / new["seconds"],
            "<= 5 s, space returned",
            new["seconds"] <= 5 and new["size_after"] < new["size_before"],
            _said(new),
            _said(old),
        )
    ]
    c = figures["conversion"]
    rows.append(
        row(
            "`delivery db partition` of a filled outbox (the unpartitioned one, pruned): the "
            "swap's hold on the tables (the pipeline's one pause)",
            None,
            "a few seconds at most",
            c["swap_ms"] < 3000,
            f"{c['messages']:,} messages converted in {c['seconds']:,.1f} s, the swap held the "
            f"tables {c['swap_ms']} ms (load {' '.join(f'{x:.2f}' for x in c['load'])})",
        )
    )
    figures["scale"] = scale = _scale(args.scale, args.rounds)
    runs = scale["runs"]
    ratio = median(scale["ratios"])
    large, small = runs["large"], runs["small"]
    rows.append(
        row(
            f"`delivery prune --older-than {KEEP}d` once a day (one day to drop): "
            f"{args.scale:,} messages vs 10,000, median of {args.rounds} alternating rounds",
            ratio,
            "about the same time (<= 1.3x)",
            ratio <= 1.3,
            f"{median([r['seconds'] for r in large]):.2f} s for "
            f"{median([r['messages'] for r in large]):,.0f} messages a day; ratios "
            f"{', '.join(f'{r:.2f}' for r in scale['ratios'])} (load "
            f"{min(r['load'] for r in large + small)}-{max(r['load'] for r in large + small)}); "
            f"beat then freed the {scale['freed']['large']['keys']:,} keys of those days in "
            f"{scale['freed']['large']['seconds']:.2f} s",
            f"{median([r['seconds'] for r in small]):.2f} s for "
            f"{median([r['messages'] for r in small]):,.0f} messages a day",
        )
    )
    report("retention", figures, rows)


if __name__ == "__main__":
    main()
