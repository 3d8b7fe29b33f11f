"""Enqueue cost: what ``delivery.enqueue`` adds to an app transaction that inserts one business
row, as a ratio of time and a count of SQL statements.

Three kinds of transaction, each ``Session(engine)`` + ``begin`` + ``add(Order)`` + ``commit``:
``plain`` (the business row only), ``enqueue`` (plus ``enqueue``, the nudge switched off, so
only what happens inside the transaction), and ``enqueue+nudge`` (as shipped: after the commit,
the nudge claims the new row and publishes its task before ``commit()`` returns). They run
interleaved in blocks of ``--block`` for ``--rounds`` rounds; medians are compared. A fourth
kind, ``floor``, is an experiment: the same validation and row through one pre-built Core
``INSERT`` (no ORM object), to show what ``enqueue`` could cost.
Statements are counted with a ``before_cursor_execute`` listener (``COMMIT`` is not a cursor
statement and is the same in all three).

    python -m bench.enqueue_cost [--rounds 10] [--block 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

import tasks  # noqa: F401  (installs the post-commit nudge in this process)
from bench.common import Order, fresh_database, log, median, report, row, session, truncate
from delivery import enqueue
from delivery.pipeline import outbox
from delivery.pipeline.models import messages_table, utcnow
from delivery.pipeline.validation import check_key, check_payload, check_recipient, payload_hash


class Counter:
    def __init__(self, engine: Any) -> None:
        self.n = 0
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, *args: Any) -> None:
        self.n += 1


def shipped(s: Session, i: int) -> None:
    enqueue(s, channel="sms", to="+12015550123", payload={"body": f"code {i}"}, key=f"k-{i}")


_FLOOR = (
    postgresql.insert(messages_table)
    .on_conflict_do_nothing(index_elements=["key"])
    .returning(messages_table.c.id)
)


def floor(s: Session, i: int) -> None:
    """What enqueue could cost (an experiment, not the shipped code): the same validation and
    row, one pre-built Core ``INSERT .. ON CONFLICT DO NOTHING RETURNING id``, no ORM object."""
    to = check_recipient("sms", "+12015550123")
    body = check_payload("sms", {"body": f"code {i}"}, 65536)
    now = utcnow()
    s.execute(
        _FLOOR,
        dict(
            key=check_key(f"f-{i}"),
            channel="sms",
            provider="stub",
            recipient=to,
            payload=body,
            payload_hash=payload_hash("sms", to, body),
            on_unknown="retry",
            status="pending",
            attempts=0,
            max_attempts=8,
            needs_lookup=False,
            next_attempt_at=now,
            created_at=now,
            updated_at=now,
        ),
    ).scalar_one()


def transaction(
    engine: Any, i: int, extra: Callable[[Session, int], None] | None, counter: Counter
) -> tuple[float, int, int]:
    """One app transaction; (seconds, statements inside it, statements during commit())."""
    start = time.perf_counter()
    before = counter.n
    s = Session(engine)
    try:
        s.begin()
        s.add(Order(ref=f"order-{i}", amount=i))
        if extra is not None:
            extra(s, i)
        s.flush()
        inside = counter.n - before
        s.commit()
    finally:
        s.close()
    elapsed = time.perf_counter() - start
    return elapsed, inside, counter.n - before - inside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=200)
    args = parser.parse_args()
    nudge = outbox._nudge
    kinds: dict[str, tuple[Callable[[Session, int], None] | None, Any]] = {
        "plain": (None, nudge),
        "enqueue": (shipped, None),
        "enqueue+nudge": (shipped, nudge),
        "floor": (floor, None),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    inside: dict[str, set[int]] = {k: set() for k in kinds}
    after: dict[str, set[int]] = {k: set() for k in kinds}
    with session():
        engine = fresh_database()
        counter = Counter(engine)
        i = 0
        for n in range(args.rounds + 1):  # round 0 warms up and is dropped
            truncate(engine)
            for kind, (work, hook) in kinds.items():
                outbox.set_nudge(hook)
                for _ in range(args.block):
                    i += 1
                    seconds, stmts, during_commit = transaction(engine, i, work, counter)
                    if n:
                        times[kind].append(seconds)
                        inside[kind].add(stmts)
                        after[kind].add(during_commit)
            log(
                f"round {n}: "
                + ", ".join(f"{k} {median(v) * 1000:.3f} ms" for k, v in times.items() if v)
            )
        outbox.set_nudge(nudge)
        med = {k: median(v) for k, v in times.items()}
        extra = med["enqueue"] / med["plain"] - 1
        extra_nudge = med["enqueue+nudge"] / med["plain"] - 1
        statements = {k: sorted(inside[k]) for k in kinds}
        nudge_statements = {k: sorted(after[k]) for k in kinds}
        added = max(inside["enqueue"]) - min(inside["plain"])
        figures = {
            "median_ms": {k: round(v * 1000, 4) for k, v in med.items()},
            "extra": round(extra, 4),
            "extra_with_nudge": round(extra_nudge, 4),
            "statements_in_transaction": statements,
            "statements_during_commit": nudge_statements,
            "transactions_per_kind": len(times["plain"]),
        }
        rows = [
            row(
                "enqueue: extra time in a one-row business transaction (nudge off)",
                1 + extra,
                "<= 1.30x",
                extra <= 0.30,
                f"{med['enqueue'] * 1000:.3f} ms per transaction",
                f"{med['plain'] * 1000:.3f} ms without enqueue",
            ),
            row(
                "enqueue: extra SQL statements in the transaction",
                None,
                "<= 1",
                added <= 1,
                f"{added} (INSERT .. ON CONFLICT DO NOTHING RETURNING)",
                f"{statements['plain']} statement(s) without enqueue",
            ),
            row(
                "enqueue + post-commit nudge (claim + publish inside commit())",
                1 + extra_nudge,
                "",
                None,
                f"{med['enqueue+nudge'] * 1000:.3f} ms; "
                f"nudge statements {nudge_statements['enqueue+nudge']}",
                f"{med['plain'] * 1000:.3f} ms without enqueue",
            ),
        ]
        extra_floor = med["floor"] / med["plain"] - 1
        figures["extra_floor"] = round(extra_floor, 4)
        rows.append(
            row(
                "experiment: same row through one pre-built Core INSERT (no ORM), nudge off",
                1 + extra_floor,
                "",
                None,
                f"{med['floor'] * 1000:.3f} ms per transaction",
                f"{med['plain'] * 1000:.3f} ms without enqueue",
            )
        )
        report("enqueue_cost", figures, rows, engine)
        engine.dispose()


if __name__ == "__main__":
    main()
