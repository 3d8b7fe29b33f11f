"""Growth: the relay's claim cost per batch with 10,000 rows in the table, and with 10,000,000
final (``sent``) rows plus 10,000 due; the query plans; the end-to-end rate at both sizes.

The outbox is partitioned by day, as ``delivery db upgrade`` leaves a PostgreSQL one: the
final rows were created over the last ``--days`` (30) days, each in its day's partition (as
if inserted then), so the claim reads the due index of every day's partition. Rows are
bulk-loaded with ``generate_series`` and the table is ``VACUUM ANALYZE``d. A claim
batch is ``delivery.relay.claims.claim(limit=500)`` in its own transaction, commit included,
on one held connection (as the beat relay runs it, so psycopg's server-side prepared statement and
PostgreSQL's plan cache are in play); the 10,000 due rows give 20 batches per round. The
claim rounds alternate between the sizes as the drains do (below), and the median batch over
``--rounds`` rounds is reported. ``EXPLAIN (ANALYZE)`` of the claim's pick at
both sizes must show the partial index ``ix_delivery_messages_due``; the generic plan (what a
prepared statement may switch to) is shown too. End to end: the same 10,000 due rows
are drained by beat's relay and a worker (threads x8), product defaults; rate = rows / (last
accept - start). The two sizes live in two databases (this slot's and ``..._large``), so the
drains alternate (small, large, then large, small, ...) over ``--e2e-rounds`` rounds, and the
figure is the median of the rounds' large / small ratios: on a shared machine the load moves
between two runs more than the table's size does. Each drain also counts the outbox's row
updates and how many were HOT (``pg_stat_user_tables``): a status change writes every index
of the row when an indexed column changes.

    python -m bench.growth [--final 10000000] [--days 30] [--due 10000] [--rounds 6]
                           [--e2e-rounds 6] [--no-e2e]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import time
from typing import Any

from psycopg import sql as psql
from sqlalchemy import create_engine, event, text

from bench.common import (
    PG_DB,
    PG_SERVER,
    Processes,
    fresh_database,
    in_turn,
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
from delivery.relay.claims import claim

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
    """The SQL and parameters of ``claim``'s pick, the statement that reads the due index
    (captured, then rolled back)."""
    seen: list[tuple[str, Any]] = []

    def capture(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        if "SKIP LOCKED" in statement:
            seen.append((statement, params))

    with engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", capture)
        trans = conn.begin()
        claim(conn, limit=500, lease=300)
        trans.rollback()
    return seen[0]


def _due_index(line: str) -> bool:
    """The line reads the due index: its own, or a day partition's (named by ``ATTACH``)."""
    return INDEX in line or "_next_attempt_at_idx" in line


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
        "uses_due_index": any(_due_index(line) for line in custom),
        "generic_uses_due_index": any(_due_index(line) for line in generic),
    }


def update_counts(engine: Any) -> tuple[int, int]:
    """Row updates of the outbox so far, and how many of them were HOT."""
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT sum(n_tup_upd), sum(n_tup_hot_upd) FROM pg_stat_user_tables "
                f"WHERE relid IN {_MESSAGES}"
            )
        ).one()
    return int(found[0]), int(found[1])


#: ``delivery_messages`` and its partitions (a partitioned table keeps no rows, sizes or row
#: counts of its own).
_MESSAGES = (
    "(SELECT 'delivery_messages'::regclass UNION ALL SELECT inhrelid FROM pg_inherits "
    "WHERE inhparent = 'delivery_messages'::regclass)"
)


def end_to_end(engine: Any, procs: Processes, stub: Any, due: int) -> dict[str, float]:
    """Drain ``due`` fresh rows of ``engine``'s outbox; the rate and the updates it made."""
    stub.reset()
    reset_due(engine, due)
    env = {"DELIVERY_DATABASE_URL": engine.url.render_as_string(hide_password=False)}
    updates, hot = update_counts(engine)
    worker = procs.worker("delivery.worker", pool="threads", concurrency=8, name="growth", env=env)
    try:
        t0 = time.time()
        beat = procs.beat(env=env)
        try:
            wait_until(lambda: effects_total(stub) >= due, 600, 0.5, f"{due} effects")
        finally:
            procs.stop(beat)
        last = max(r["at"] for r in stub.requests() if r["outcome"] == "effect")
    finally:
        procs.stop(worker)
    time.sleep(1.0)  # the stopped processes' backends report their statistics as they exit
    after, hot_after = update_counts(engine)
    return {
        "rate": round(due / (last - t0), 1),
        "updates_per_row": round((after - updates) / due, 2),
        "hot_share": round((hot_after - hot) / max(after - updates, 1), 3),
        "loadavg": round(os.getloadavg()[0], 2),
    }


def alternate(
    engines: dict[str, Any], procs: Processes, stub: Any, due: int, rounds: int
) -> dict[str, Any]:
    """Drain both sizes in alternating order, ``rounds`` times; every run and the median of
    the per-round ratios (large / small)."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for number in range(rounds):
        for name in in_turn(engines, number):
            runs[name].append(end_to_end(engines[name], procs, stub, due))
            log(f"  round {number + 1} {name}: {runs[name][-1]}")
    ratios = [
        big["rate"] / small["rate"] for small, big in zip(runs["small"], runs["large"], strict=True)
    ]
    return {
        "runs": runs,
        "ratios": [round(r, 3) for r in ratios],
        "ratio_median": round(median(ratios), 3),
        "rate_median": {name: median([r["rate"] for r in rs]) for name, rs in runs.items()},
    }


def claim_rounds(engines: dict[str, Any], due: int, rounds: int) -> dict[str, list[float]]:
    """Claim ``due`` fresh rows of each outbox in batches, ``rounds`` times, alternating the
    order (small, large, then large, small, ...) as the drains do: the seconds each batch
    took, per size."""
    per_batch: dict[str, list[float]] = {name: [] for name in engines}
    for number in range(rounds):
        for name in in_turn(engines, number):
            reset_due(engines[name], due)
            per_batch[name] += claim_batches(engines[name])
    return per_batch


def measure(engine: Any, due: int, per_batch: list[float]) -> dict[str, Any]:
    """One size's claim figures from its batches, its size, and its plans."""
    reset_due(engine, due)
    with engine.connect() as conn:
        total = conn.scalar(text("SELECT count(*) FROM delivery_messages"))
        size = conn.scalar(
            text(
                "SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM pg_class c "
                f"WHERE c.oid IN {_MESSAGES}"
            )
        )
    return {
        "rows": total,
        "table_size": size,
        "batches": len(per_batch),
        "claim_ms_median": round(median(per_batch) * 1000, 3),
        "claim_ms_p90": round(sorted(per_batch)[int(len(per_batch) * 0.9)] * 1000, 3),
        "loadavg": round(os.getloadavg()[0], 2),
        **explain(engine),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--final", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=30, help="the final rows' days")
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=6, help="claim rounds per size")
    parser.add_argument("--e2e-rounds", type=int, default=6, help="drains per size")
    parser.add_argument("--no-e2e", action="store_true")
    args = parser.parse_args()
    large_db = f"{PG_DB}_large"
    with session() as procs:
        since = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=args.days + 1)
        engines = {"small": fresh_database(), "large": fresh_database(large_db, since=since)}
        log(f"loading {args.final:,} final rows over {args.days} days into {large_db}")
        insert_rows(
            engines["large"],
            args.final,
            status="sent",
            prefix="final",
            due_seconds_ago=3600,
            days=args.days,
        )
        log(f"claims: {args.rounds} alternating rounds")
        batches = claim_rounds(engines, args.due, args.rounds)
        figures: dict[str, Any] = {}
        for name, engine in engines.items():
            figures[name] = measure(engine, args.due, batches[name])
            log(f"  {name}: { ({k: v for k, v in figures[name].items() if 'plan' not in k}) }")
        small, large = figures["small"], figures["large"]
        ratio = large["claim_ms_median"] / small["claim_ms_median"]
        figures["claim_ratio"] = round(ratio, 3)
        rows = [
            row(
                f"claim per 500-row batch, {large['rows']:,} vs {small['rows']:,} rows",
                ratio,
                "<= 1.3x",
                ratio <= 1.3,
                f"{large['claim_ms_median']} ms at {large['rows']:,} rows ({large['table_size']}; "
                f"median of {args.rounds} alternating rounds; load {large['loadavg']})",
                f"{small['claim_ms_median']} ms at {small['rows']:,} rows",
            ),
            row(
                f"claim plan uses {INDEX} (custom / generic plan)",
                None,
                "uses the partial index",
                all(
                    f[k]
                    for f in (small, large)
                    for k in ("uses_due_index", "generic_uses_due_index")
                ),
                f"{large['uses_due_index']} / {large['generic_uses_due_index']} at "
                f"{large['rows']:,}",
                f"{small['uses_due_index']} / {small['generic_uses_due_index']} at "
                f"{small['rows']:,}",
            ),
        ]
        if not args.no_e2e:
            stub = procs.stub()
            log(f"end to end: {args.e2e_rounds} alternating rounds")
            e2e = alternate(engines, procs, stub, args.due, args.e2e_rounds)
            figures["e2e"] = e2e
            runs = e2e["runs"]
            loads = [r["loadavg"] for rs in runs.values() for r in rs]
            hot = [r["hot_share"] for rs in runs.values() for r in rs]
            per_row = [r["updates_per_row"] for rs in runs.values() for r in rs]
            rows.append(
                row(
                    f"end to end, {args.due:,} due rows drained (relay + threads x8), median of "
                    f"{args.e2e_rounds} alternating rounds",
                    e2e["ratio_median"],
                    ">= 0.95x",
                    e2e["ratio_median"] >= 0.95,
                    f"{e2e['rate_median']['large']:,.0f} msg/s at {large['rows']:,} rows; "
                    f"ratios {', '.join(f'{r:.2f}' for r in e2e['ratios'])}; "
                    f"{min(per_row):.1f}-{max(per_row):.1f} updates per row, "
                    f"{max(hot):.0%} HOT; load {min(loads)}-{max(loads)}",
                    f"{e2e['rate_median']['small']:,.0f} msg/s at {small['rows']:,} rows",
                )
            )
        report("growth", figures, rows, engines["small"])
        for engine in engines.values():
            truncate(engine)
            engine.dispose()
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # do not leave a 500 MB database behind
        conn.execute(text(f"DROP DATABASE IF EXISTS {large_db}"))
    admin.dispose()


if __name__ == "__main__":
    main()
