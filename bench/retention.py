"""Retention (issue 29): what ``delivery prune`` costs on a large outbox, and what space it
gives back. Today's baseline, measured the way a user runs it: the half of issue 29's
figures that a partitioned outbox is to be compared with, in the same run, once it exists.

An outbox of ``--messages`` (2,000,000) spread over the last 20 days (``delivery.testing.fill``:
mostly ``sent``, some ``dead``, ``unknown`` and open ``pending`` ones), each with one attempt
row, in a database of its own; then ``delivery prune --older-than 10d`` as a subprocess (its
batches of 1,000, as shipped), timed, with the tables' size before and after (PostgreSQL's
``pg_total_relation_size``: messages and attempts with their indexes).

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

from bench.common import PG_DB, PG_SERVER, ROOT, fresh_database, log, report, row
from delivery.testing.fill import fill_outbox

DAYS = 20
OLDER_THAN = "10d"
TABLES = ("delivery_messages", "delivery_attempts")


def _size(engine: Any) -> int:
    with engine.connect() as conn:
        return sum(
            int(conn.scalar(text("SELECT pg_total_relation_size(:t)"), {"t": t})) for t in TABLES
        )


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:,.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    args = parser.parse_args()
    name = f"{PG_DB}_retention"
    engine = fresh_database(name)
    try:
        log(f"filling {args.messages:,} messages over {DAYS} days, one attempt each")
        started = time.monotonic()
        with engine.begin() as conn:
            spacing = dt.timedelta(days=DAYS) / args.messages
            fill_outbox(conn, args.messages, spacing)
            conn.execute(
                text(
                    "INSERT INTO delivery_attempts (message_id, number, kind, provider, "
                    "started_at, outcome, http_status) SELECT id, 1, 'send', provider, "
                    "created_at, 'delivered', 201 FROM delivery_messages"
                )
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in TABLES:
                conn.execute(text(f"VACUUM ANALYZE {table}"))
        log(f"  filled in {time.monotonic() - started:.0f} s")
        before = _size(engine)
        load = os.getloadavg()
        env = {**os.environ, "DELIVERY_DATABASE_URL": f"{PG_SERVER}/{name}"}
        argv = [sys.executable, "-m", "delivery.cli", "prune", "--older-than", OLDER_THAN]
        log(f"delivery prune --older-than {OLDER_THAN}")
        started = time.monotonic()
        done = subprocess.run(
            [*argv, "--json"], env=env, cwd=ROOT, capture_output=True, text=True, check=True
        )
        seconds = time.monotonic() - started
        pruned = json.loads(done.stdout)
        after = _size(engine)
        log(f"  {pruned} in {seconds:.1f} s; {_mb(before)} -> {_mb(after)}")
        figures = {
            "messages": args.messages,
            "pruned": pruned,
            "seconds": round(seconds, 1),
            "size_before": before,
            "size_after": after,
            "load": [round(x, 2) for x in load],
        }
        rows = [
            row(
                f"`delivery prune --older-than {OLDER_THAN}` on {args.messages:,} messages over "
                f"{DAYS} days (one attempt each), unpartitioned: today's baseline",
                None,
                "issue 29: <= 5 s, space returned",
                seconds <= 5 and after < before,
                f"{pruned['messages']:,} messages and {pruned['attempts']:,} attempts in "
                f"{seconds:,.1f} s ({pruned['messages'] / seconds:,.0f} messages/s); messages + "
                f"attempts {_mb(before)} before, {_mb(after)} after (load "
                f"{' '.join(f'{x:.2f}' for x in load)})",
            )
        ]
        report("retention", figures, rows, engine)
    finally:
        engine.dispose()
        admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


if __name__ == "__main__":
    main()
