"""Diagnosis: PostgreSQL's share of the batch path, statement by statement, without Celery.

    python -m bench.batch_sql [--messages 5000] [--batch 50]

Bulk-loads due rows, claims them as the relay does, then runs ``deliver_many`` over batches of
``--batch`` against the stub in this process. Prints one JSON line: per statement kind its
calls, client-side ms per call and per message, and the CPU of the database's backends per
message (all of them, /proc), next to the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import defaultdict
from typing import Any

from sqlalchemy import event

from bench.common import (
    cpu_seconds,
    database_backends,
    fresh_database,
    insert_rows,
    log,
    session,
)
from delivery.relay.claims import claim
from delivery.runtime.current import get_settings
from delivery.runtime.service import Service
from delivery.sending.sender import deliver_many


def kind(statement: str) -> str:
    words = re.sub(r"\s+", " ", statement).strip()[:60]
    return words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    with session() as procs:
        engine = fresh_database()
        procs.stub()
        insert_rows(engine, args.messages)
        with engine.begin() as conn:
            claims = claim(conn, limit=10**6, lease=600)
        service = Service.from_settings(get_settings())

        @event.listens_for(service.engine, "before_cursor_execute")
        def _before(conn: Any, cursor: Any, statement: str, *a: Any) -> None:
            conn.info["t0"] = time.perf_counter()

        @event.listens_for(service.engine, "after_cursor_execute")
        def _after(conn: Any, cursor: Any, statement: str, *a: Any) -> None:
            s = stats[kind(statement)]
            s[0] += 1
            s[1] += (time.perf_counter() - conn.info["t0"]) * 1000

        pairs = [(c.id, c.key) for c in claims]
        deliver_many(service, pairs[: args.batch])  # warm-up
        stats.clear()
        rest = pairs[args.batch :]
        backends = database_backends(engine)
        cpu0 = cpu_seconds(backends)
        load = os.getloadavg()
        t0 = time.perf_counter()
        for first in range(0, len(rest), args.batch):
            results = deliver_many(service, rest[first : first + args.batch])
            assert all(r.status == "sent" for r in results), results[:3]
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(database_backends(engine) + backends) - cpu0
        n = len(rest)
        out = {
            "messages": n,
            "batch": args.batch,
            "rate": round(n / wall, 1),
            "pg_cpu_ms_per_msg": round(cpu * 1000 / n, 3),
            "load": [round(x, 2) for x in load],
            "statements": {
                k: {"calls": c, "ms_per_call": round(t / c, 3), "ms_per_msg": round(t / n, 4)}
                for k, (c, t) in sorted(stats.items(), key=lambda kv: -kv[1][1])
            },
        }
        log(json.dumps(out, indent=1))
        print(json.dumps(out))
        service.close()
        engine.dispose()


if __name__ == "__main__":
    main()
