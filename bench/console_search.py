"""The ops console on a large outbox: each message-search page and the overview's chart
queries on 1,000,000 rows, with the console's indexes (migrations 0004_audit and 0005: the key's
unique index in ``varchar_pattern_ops`` answers prefixes) and, in the same run, without them
(the baseline: the schema of 0002, where a filtered page reads the table and the key's unique
index has the column's own collation).

Rows are bulk-loaded with ``generate_series`` (statuses, providers, codes and types mixed as
in ``tests/test_console_plan.py``), ``VACUUM ANALYZE``d; each query is the one the console runs
(``delivery.ops.search`` for a page of 50, ``delivery.ops.series`` for a chart window), timed
as the median of ``--repeat`` runs after one warm-up. The figures also go into the "Ops
console" section of ``bench/RELIABILITY.md``.

    python -m bench.console_search [--rows 1000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from bench.common import ROOT, fresh_database, log, median, report, row, vacuum
from delivery import ops
from delivery.testing.fill import fill_outbox

CONSOLE_INDEXES = (
    "ix_delivery_messages_status_id",
    "ix_delivery_messages_provider_id",
    "ix_delivery_messages_code_id",
)
#: The baseline's key index: unique, in the column's collation (not usable for LIKE 'x%').
PLAIN_KEY_INDEX = (
    "DROP INDEX uq_delivery_messages_key",
    "CREATE UNIQUE INDEX uq_delivery_messages_key ON delivery_messages (key)",
)

PAGES: list[tuple[str, dict[str, str]]] = [
    ("newest (no filter)", {}),
    ("key exact", {"key": "order-123457:receipt"}),
    ("key prefix order-12345*", {"key": "order-12345*"}),
    ("status=dead", {"status": "dead"}),
    ("status=unknown", {"status": "unknown"}),
    ("provider=twilio", {"provider": "twilio"}),
    ("code=21211", {"code": "21211"}),
    ("dead + twilio + 503", {"status": "dead", "provider": "twilio", "code": "503"}),
]


def timed(engine: Any, fn: Any, repeat: int) -> float:
    """Median milliseconds of ``fn(session)`` over ``repeat`` runs, after one warm-up."""
    samples = []
    with Session(engine) as session:
        fn(session)
        for _ in range(repeat):
            started = time.perf_counter()
            fn(session)
            samples.append((time.perf_counter() - started) * 1000.0)
            session.rollback()
    return median(samples)


def measure(engine: Any, repeat: int, middle: int) -> dict[str, float]:
    found: dict[str, float] = {}
    for name, params in PAGES:
        flt = ops.parse_filter(params)
        found[f"{name}: first page"] = timed(engine, lambda s, f=flt: ops.search(s, f), repeat)
        found[f"{name}: deep page"] = timed(
            engine, lambda s, f=flt: ops.search(s, f, before=middle), repeat
        )
    found["overview chart, last hour"] = timed(engine, lambda s: ops.series(s), repeat)
    found["overview chart, last day"] = timed(
        engine, lambda s: ops.series(s, window=86400, bucket=900), repeat
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    engine = fresh_database()
    log(f"loading {args.rows} rows")
    with engine.begin() as conn:
        fill_outbox(conn, args.rows, dt.timedelta(milliseconds=100))
    vacuum(engine)
    loadavg = Path("/proc/loadavg").read_text().split()[:3]
    log("with the console's indexes")
    indexed = measure(engine, args.repeat, args.rows // 2)
    with engine.begin() as conn:
        for name in CONSOLE_INDEXES:
            conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
        for statement in PLAIN_KEY_INDEX:
            conn.execute(text(statement))
    vacuum(engine)
    log("baseline: without them")
    baseline = measure(engine, args.repeat, args.rows // 2)
    loadavg_after = Path("/proc/loadavg").read_text().split()[:3]
    rows = [
        row(
            f"console {name} ({args.rows:,} rows)",
            indexed[name] / baseline[name] if baseline[name] else None,
            "<= 50 ms",
            indexed[name] <= 50.0,
            f"{indexed[name]:.1f} ms",
            f"{baseline[name]:.1f} ms without the 0004_audit indexes",
        )
        for name in indexed
    ]
    figures = {
        "rows": args.rows,
        "repeat": args.repeat,
        "indexed_ms": {k: round(v, 2) for k, v in indexed.items()},
        "baseline_ms": {k: round(v, 2) for k, v in baseline.items()},
        "loadavg": " ".join(loadavg),
        "loadavg_after": " ".join(loadavg_after),
    }
    report("console_search", figures, rows, engine)
    write_reliability_section(figures)
    engine.dispose()
    return 0


SECTION = "## Ops console"


def render_section(figures: dict[str, Any]) -> str:
    """The "Ops console" section of bench/RELIABILITY.md from the figures of one run."""
    lines = [
        SECTION,
        "",
        f"Message search and chart queries of `delivery console` on {figures['rows']:,} outbox "
        "rows (PostgreSQL), median of "
        f"{figures['repeat']} runs each, with the console's indexes (migration 0004_audit) and, in "
        "the same run, without them; load average "
        f"{figures['loadavg']} before, {figures['loadavg_after']} after "
        "(`python -m bench.console_search`; the plans are checked by "
        "`tests/test_console_plan.py`).",
        "",
        "| query | with the 0004_audit indexes (ms) | without (ms) |",
        "|---|---:|---:|",
    ]
    for name, ms in figures["indexed_ms"].items():
        lines.append(f"| {name} | {ms:.1f} | {figures['baseline_ms'][name]:.1f} |")
    return "\n".join(lines) + "\n"


def write_reliability_section(figures: dict[str, Any]) -> None:
    path = ROOT / "bench" / "RELIABILITY.md"
    text_ = path.read_text()
    head = text_.split("\n" + SECTION, 1)[0].rstrip("\n")
    path.write_text(head + "\n\n" + render_section(figures))


if __name__ == "__main__":
    raise SystemExit(main())
