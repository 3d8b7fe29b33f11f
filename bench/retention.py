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
Last, the unpartitioned outbox (what its prune left) is converted with ``delivery db
partition``, timed, with how long its swap held the tables (the pipeline's one pause).

    python -m bench.retention [--messages 2000000]
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

from bench.common import BROKER_URL, PG_DB, PG_SERVER, ROOT, log, report, row
from delivery.runtime import conversion
from delivery.runtime.db import make_engine, upgrade
from delivery.testing.fill import fill_outbox

DAYS = 20
OLDER_THAN = "10d"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
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
    report("retention", figures, rows)


if __name__ == "__main__":
    main()
