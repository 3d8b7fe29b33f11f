"""Growth: the relay's claim cost per batch with 10,000 rows in the table, and with 1,000,000
final (``sent``) rows plus 10,000 due; the query plans; the end-to-end rate at both sizes.

Rows are bulk-loaded with ``generate_series`` and the table is ``VACUUM ANALYZE``d. A claim
batch is ``delivery.pipeline.relay.claim(limit=500)`` in its own transaction, commit included,
on one held connection (as the beat relay runs it, so psycopg's server-side prepared statement and
PostgreSQL's plan cache are in play); the 10,000 due rows give 20 batches per round, and the
median over ``--rounds`` rounds is reported. ``EXPLAIN (ANALYZE)`` of the claim statement at
both sizes must show the partial index ``ix_delivery_messages_due``; the generic plan (what a
prepared statement may switch to) is shown too. End to end: the same 10,000 due rows are
drained by beat's relay and a worker (threads x8); rate = rows / (last accept - start).

    python -m bench.growth [--final 1000000] [--due 10000] [--rounds 3] [--no-e2e]
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

from psycopg import sql as psql
from sqlalchemy import event, text

from bench.common import (
    Processes,
    fresh_database,
    insert_rows,
    log,
    median,
    report,
    row,
    session,
    truncate,
    vacuum,
    wait_until,
)
from delivery.pipeline.relay import claim

INDEX = "ix_delivery_messages_due"


def effects_total(stub: Any) -> int:
    return int(stub._http.get("/_stub/effects").json()["total"])


def reset_due(engine: Any, due: int) -> None:
    """Replace the due rows (whatever they became) with ``due`` fresh pending rows."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM delivery_messages WHERE key LIKE 'due-%'"))
    insert_rows(engine, due, prefix="due")
    vacuum(engine)


def claim_batches(engine: Any, batch: int = 500) -> list[float]:
    """Claim every due row in batches on one connection; the seconds each batch took."""
    times = []
    with engine.connect() as conn:
        while True:
            start = time.perf_counter()
            with conn.begin():
                claimed = claim(conn, limit=batch, lease=300)
            times.append(time.perf_counter() - start)
            if not claimed:
                times.pop()
                return times


def claim_statement(engine: Any) -> tuple[str, Any]:
    """The SQL and parameters ``claim`` sends (captured, then rolled back)."""
    seen: list[tuple[str, Any]] = []

    def capture(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        if statement.lstrip().upper().startswith("UPDATE"):
            seen.append((statement, params))

    with engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", capture)
        trans = conn.begin()
        claim(conn, limit=500, lease=300)
        trans.rollback()
    return seen[0]


def explain(engine: Any) -> dict[str, Any]:
    """The claim's plan as run (``EXPLAIN ANALYZE``, rolled back) and its generic plan (what a
    server-side prepared statement may switch to after five runs: parameters unknown)."""
    statement, params = claim_statement(engine)
    names: list[str] = []

    def numbered(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", numbered, statement)
    with engine.connect() as conn:
        trans = conn.begin()
        custom = [
            r[0] for r in conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF) " + statement, params)
        ]
        trans.rollback()
        raw = conn.connection.dbapi_connection
        raw.rollback()
        with raw.cursor() as cur:
            cur.execute("PREPARE bench_claim AS " + prepared)
            cur.execute("SET plan_cache_mode = force_generic_plan")
            arguments = psql.SQL(", ").join(psql.Literal(params[n]) for n in names)
            query = psql.SQL("EXPLAIN (COSTS OFF) EXECUTE bench_claim({})").format(arguments)
            generic = [r[0] for r in cur.execute(query).fetchall()]
            cur.execute("RESET plan_cache_mode")
            cur.execute("DEALLOCATE bench_claim")
        raw.rollback()
    return {
        "plan": custom,
        "generic_plan": generic,
        "uses_due_index": any(INDEX in line for line in custom),
        "generic_uses_due_index": any(INDEX in line for line in generic),
    }


def end_to_end(engine: Any, procs: Processes, stub: Any, due: int) -> float:
    stub.reset()
    reset_due(engine, due)
    worker = procs.worker("tasks", pool="threads", concurrency=8, name="growth")
    try:
        t0 = time.time()
        beat = procs.beat()
        try:
            wait_until(lambda: effects_total(stub) >= due, 600, 0.5, f"{due} effects")
        finally:
            procs.stop(beat)
        last = max(r["at"] for r in stub.requests() if r["outcome"] == "effect")
    finally:
        procs.stop(worker)
    return float(due / (last - t0))


def measure(engine: Any, due: int, rounds: int) -> dict[str, Any]:
    per_batch: list[float] = []
    for _ in range(rounds):
        reset_due(engine, due)
        per_batch += claim_batches(engine)
    reset_due(engine, due)
    with engine.connect() as conn:
        total = conn.scalar(text("SELECT count(*) FROM delivery_messages"))
        size = conn.scalar(
            text("SELECT pg_size_pretty(pg_total_relation_size('delivery_messages'))")
        )
    return {
        "rows": total,
        "table_size": size,
        "batches": len(per_batch),
        "claim_ms_median": round(median(per_batch) * 1000, 3),
        "claim_ms_p90": round(sorted(per_batch)[int(len(per_batch) * 0.9)] * 1000, 3),
        **explain(engine),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--final", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-e2e", action="store_true")
    args = parser.parse_args()
    with session() as procs:
        engine = fresh_database()
        stub = None if args.no_e2e else procs.stub()
        log(f"small: {args.due:,} rows")
        small = measure(engine, args.due, args.rounds)
        if stub is not None:
            small["e2e_rate"] = round(end_to_end(engine, procs, stub, args.due), 1)
        log(f"  { ({k: v for k, v in small.items() if 'plan' not in k}) }")
        truncate(engine)
        log(f"loading {args.final:,} final rows")
        insert_rows(engine, args.final, status="sent", prefix="final", due_seconds_ago=3600)
        log(f"large: {args.final:,} final + {args.due:,} due rows")
        large = measure(engine, args.due, args.rounds)
        if stub is not None:
            large["e2e_rate"] = round(end_to_end(engine, procs, stub, args.due), 1)
        log(f"  { ({k: v for k, v in large.items() if 'plan' not in k}) }")
        ratio = large["claim_ms_median"] / small["claim_ms_median"]
        figures = {"small": small, "large": large, "claim_ratio": round(ratio, 3)}
        rows = [
            row(
                f"claim per 500-row batch, {large['rows']:,} vs {small['rows']:,} rows",
                ratio,
                "<= 1.6x",
                ratio <= 1.6,
                f"{large['claim_ms_median']} ms at {large['rows']:,} rows ({large['table_size']})",
                f"{small['claim_ms_median']} ms at {small['rows']:,} rows",
            ),
            row(
                f"claim plan uses {INDEX} (custom / generic plan)",
                None,
                "uses the partial index",
                large["uses_due_index"] and small["uses_due_index"],
                f"{large['uses_due_index']} / {large['generic_uses_due_index']} at "
                f"{large['rows']:,}",
                f"{small['uses_due_index']} / {small['generic_uses_due_index']} at "
                f"{small['rows']:,}",
            ),
        ]
        if stub is not None:
            e2e = large["e2e_rate"] / small["e2e_rate"]
            rows.append(
                row(
                    f"end to end, {args.due:,} due rows drained (relay + threads x8)",
                    e2e,
                    "flat",
                    None,
                    f"{large['e2e_rate']:,.0f} msg/s at {large['rows']:,} rows",
                    f"{small['e2e_rate']:,.0f} msg/s at {small['rows']:,} rows",
                )
            )
        report("growth", figures, rows, engine)
        truncate(engine)  # do not leave a 300 MB table behind
        engine.dispose()


if __name__ == "__main__":
    main()
