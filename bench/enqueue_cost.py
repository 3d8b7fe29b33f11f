"""Enqueue cost: what ``delivery.enqueue`` adds to an app transaction that inserts one business
row, as a ratio of time and a count of SQL statements.

Three kinds of transaction for the product, each ``Session(engine)`` + ``begin`` +
``add(Order)`` + ``commit``: ``plain`` (the business row only), ``enqueue`` (plus ``enqueue``,
the nudge switched off, so only what happens inside the transaction), and ``enqueue+nudge`` (as
shipped: the row is written claimed, and after the commit the nudge publishes its task before
``commit()`` returns, with no statement of its own). All the kinds run interleaved in blocks
of ``--block`` for ``--rounds`` rounds; medians are compared.

``celery alone`` is the same transaction, then ``apply_async`` of Celery alone's task (recipient
and body in the broker) after the commit: what an app pays per message without an outbox, to
read ``enqueue+nudge`` against.

Two more kinds are floors, not products, to read the ratio against on the machine at hand.
Both run on the session's own connection, through the driver's cursor (no SQLAlchemy):
``any statement`` adds the cheapest second statement a transaction can have (one integer into
a one-column table), which is what any outbox that writes its row as a statement of its own
costs at least; ``row, raw driver`` adds ``enqueue``'s own INSERT of the same validated row,
which is what the row costs the driver and the database (the text SQLAlchemy compiles for it
and the parameters its column types bind: ``insert.compiled_insert``). ``enqueue`` less
``row, raw driver`` is what ``delivery``'s Python adds; ``enqueue`` is to stay within 1.15x of
it, and ``enqueue+nudge`` within 1.3x of ``celery alone``.
Statements are counted with a ``before_cursor_execute`` listener (``COMMIT`` is not a cursor
statement and is the same in all three).

    python -m bench.enqueue_cost [--rounds 10] [--block 200] [--many 10000] [--campaign 100000]

``enqueue_many`` (issue 13): ``--many`` messages in one transaction through ``enqueue_many``
next to a loop of ``enqueue`` (rows/s, nudge off, interleaved, median of 3), to distinct
recipients as a campaign's are (each number parsed and validated: ``--many`` of them overflow
the cache of checked numbers) and, beside it, to one number again and again (its check
cached); then ``--campaign`` messages to distinct recipients from a generator in one
transaction, with this process's peak RSS growth (``ru_maxrss``): the messages are never all
held at once.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.orm import Session

from bench import celery_alone
from bench.common import Order, fresh_database, log, median, report, row, session, truncate
from delivery import enqueue, enqueue_many
from delivery.outbox import enqueue as outbox
from delivery.outbox import insert
from delivery.outbox.enqueue import row_values
from delivery.runtime.current import get_settings
from delivery.worker import app as _tasks  # noqa: F401  (after bench.common: installs the nudge here)


class Counter:
    def __init__(self, engine: Any) -> None:
        self.n = 0
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, *args: Any) -> None:
        self.n += 1


def shipped(s: Session, i: int) -> None:
    enqueue(s, channel="sms", to="+12015550123", payload={"body": f"code {i}"}, key=f"k-{i}")


_FLOOR_TABLE = "bench_floor"


def _driver(s: Session) -> Any:
    """The session's own DBAPI connection (its transaction), for the floors."""
    return s.connection().connection.driver_connection


def any_statement(s: Session, i: int) -> None:
    """Floor: the cheapest second statement (an integer into a one-column table)."""
    _driver(s).cursor().execute(f"INSERT INTO {_FLOOR_TABLE} VALUES (%s)", (i,))


def raw_row(s: Session, i: int) -> None:
    """Floor: ``enqueue``'s INSERT of the same validated row, through the driver's cursor: the
    very text and parameters ``enqueue`` sends (``insert.compiled_insert``)."""
    statement = insert.compiled_insert(s.connection().dialect)
    cursor = _driver(s).cursor()
    cursor.execute(statement.sql, statement.parameters(row_values(get_settings(), _spec("raw", i))))
    cursor.fetchone()


def apply_async(i: int) -> None:
    """Celery alone's way, after the commit: the task with the recipient and the body."""
    celery_alone.send.apply_async((i, "+12015550123", {"body": f"code {i}"}, f"alone-{i}"))


def _spec(prefix: str, i: int, distinct: bool = False) -> dict[str, Any]:
    """Message ``i``: to ``+12015550123``, or with ``distinct`` to the ``i``-th of 100,000
    valid numbers (+1 201 200-0000 ..), as a campaign's recipients are."""
    to = f"+1201{200 + i % 100_000 // 10_000}{i % 10_000:04d}" if distinct else "+12015550123"
    return dict(channel="sms", to=to, payload={"body": f"code {i}"}, key=f"{prefix}-{i}")


def many_rates(engine: Any, n: int, distinct: bool) -> dict[str, Any]:
    """rows/s of ``n`` messages in one transaction: an ``enqueue`` loop vs ``enqueue_many``,
    to ``distinct`` recipients or to one number."""
    outbox.set_nudge(None)
    rates: dict[str, list[float]] = {"loop": [], "many": []}
    to = "distinct recipients" if distinct else "one number"
    for round_ in range(3):
        for kind in ("loop", "many") if round_ % 2 == 0 else ("many", "loop"):
            truncate(engine)
            start = time.perf_counter()
            with Session(engine) as s, s.begin():
                if kind == "loop":
                    for i in range(n):
                        enqueue(s, **_spec(f"{kind}{round_}", i, distinct))
                else:
                    enqueue_many(s, (_spec(f"{kind}{round_}", i, distinct) for i in range(n)))
            rates[kind].append(n / (time.perf_counter() - start))
            log(f"{n} in one transaction to {to}, {kind}: {rates[kind][-1]:,.0f} rows/s")
    return {k: round(median(v), 1) for k, v in rates.items()}


def campaign(engine: Any, n: int) -> dict[str, Any]:
    """``n`` messages from a generator through ``enqueue_many`` in one transaction."""
    truncate(engine)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with Session(engine) as s, s.begin():
        done = enqueue_many(s, (_spec("campaign", i, True) for i in range(n)))
    seconds = time.perf_counter() - start
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert done.created == n
    return {
        "messages": n,
        "seconds": round(seconds, 2),
        "rows_per_s": round(n / seconds, 1),
        "peak_rss_growth_mib": round((peak_after - peak_before) / 1024, 1),
        "peak_rss_mib": round(peak_after / 1024, 1),
    }


def transaction(
    engine: Any,
    i: int,
    extra: Callable[[Session, int], None] | None,
    counter: Counter,
    then: Callable[[int], None] | None = None,
) -> tuple[float, int, int]:
    """One app transaction, then ``then`` after its commit; (seconds, statements inside it,
    statements during commit())."""
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
    if then is not None:
        then(i)
    elapsed = time.perf_counter() - start
    return elapsed, inside, counter.n - before - inside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument("--campaign", type=int, default=100_000)
    args = parser.parse_args()
    nudge = outbox._nudge
    Work = Callable[[Session, int], None] | None
    kinds: dict[str, tuple[Work, Any, Callable[[int], None] | None]] = {
        "plain": (None, nudge, None),
        "enqueue": (shipped, None, None),
        "enqueue+nudge": (shipped, nudge, None),
        "celery alone": (None, None, apply_async),
        "any statement": (any_statement, None, None),
        "row, raw driver": (raw_row, None, None),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    inside: dict[str, set[int]] = {k: set() for k in kinds}
    after: dict[str, set[int]] = {k: set() for k in kinds}
    with session():
        engine = fresh_database()
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE IF NOT EXISTS {_FLOOR_TABLE} (x integer)"))
        counter = Counter(engine)
        i = 0
        for n in range(args.rounds + 1):  # round 0 warms up and is dropped
            truncate(engine)
            for kind, (work, hook, then) in kinds.items():
                outbox.set_nudge(hook)
                for _ in range(args.block):
                    i += 1
                    seconds, stmts, during_commit = transaction(engine, i, work, counter, then)
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
        floor_ratio = med["enqueue"] / med["row, raw driver"]
        whole = med["enqueue+nudge"] / med["celery alone"]
        figures = {
            "median_ms": {k: round(v * 1000, 4) for k, v in med.items()},
            "extra": round(extra, 4),
            "extra_with_nudge": round(extra_nudge, 4),
            "statements_in_transaction": statements,
            "statements_during_commit": nudge_statements,
            "transactions_per_kind": len(times["plain"]),
        }
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        rows = [
            row(
                "enqueue: extra time in a one-row business transaction (nudge off)",
                1 + extra,
                "",
                None,
                f"{med['enqueue'] * 1000:.3f} ms per transaction (load {load})",
                f"{med['plain'] * 1000:.3f} ms without enqueue",
            ),
            row(
                "enqueue in a one-row business transaction vs the same transaction with "
                "enqueue's INSERT through the bare driver (nudge off)",
                floor_ratio,
                "<= 1.15x",
                floor_ratio <= 1.15,
                f"{med['enqueue'] * 1000:.3f} ms (load {load})",
                f"row, raw driver {med['row, raw driver'] * 1000:.3f} ms",
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
                "enqueue + post-commit nudge (the row written claimed; the publish inside "
                "commit())",
                1 + extra_nudge,
                "",
                None,
                f"{med['enqueue+nudge'] * 1000:.3f} ms; "
                f"nudge statements {nudge_statements['enqueue+nudge']}",
                f"{med['plain'] * 1000:.3f} ms without enqueue",
            ),
            row(
                "the app's whole cost per message: enqueue + nudge vs Celery alone "
                "(the same transaction, then apply_async)",
                whole,
                "<= 1.3x",
                whole <= 1.3,
                f"{med['enqueue+nudge'] * 1000:.3f} ms (load {load})",
                f"Celery alone {med['celery alone'] * 1000:.3f} ms",
            ),
        ]
        for kind, what in (
            ("any statement", "floor: the cheapest second statement, through the driver"),
            ("row, raw driver", "floor: enqueue's INSERT of the same row, through the driver"),
        ):
            figures[f"extra_{kind}"] = round(med[kind] / med["plain"] - 1, 4)
            rows.append(
                row(
                    f"{what} (no SQLAlchemy, nudge off)",
                    med[kind] / med["plain"],
                    "",
                    None,
                    f"{med[kind] * 1000:.3f} ms per transaction",
                    f"{med['plain'] * 1000:.3f} ms without",
                )
            )
        figures["delivery_python_ms"] = round((med["enqueue"] - med["row, raw driver"]) * 1000, 4)
        big = campaign(engine, args.campaign)  # first: its peak RSS is not hidden by the loop's
        rates = many_rates(engine, args.many, distinct=True)
        cached = many_rates(engine, args.many, distinct=False)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        outbox.set_nudge(nudge)
        figures.update(enqueue_many=rates, enqueue_many_one_number=cached, campaign=big)
        for measured, to in ((rates, "distinct recipients"), (cached, "one number (cached)")):
            ratio = measured["many"] / measured["loop"]
            rows.append(
                row(
                    f"enqueue_many: rows/s of {args.many:,} messages to {to} in one "
                    "transaction vs an enqueue loop",
                    ratio,
                    ">= 10x",
                    ratio >= 10,
                    f"{measured['many']:,.0f} rows/s (load {load})",
                    f"enqueue loop {measured['loop']:,.0f} rows/s",
                )
            )
        rows.append(
            row(
                f"enqueue_many: {args.campaign:,} messages to distinct recipients from a generator "
                "in one transaction",
                None,
                "not all held at once",
                big["peak_rss_growth_mib"] < 200,
                f"{big['seconds']} s, {big['rows_per_s']:,.0f} rows/s, peak RSS +"
                f"{big['peak_rss_growth_mib']} MiB (to {big['peak_rss_mib']} MiB; load {load})",
                "",
            )
        )
        report("enqueue_cost", figures, rows, engine)
        engine.dispose()


if __name__ == "__main__":
    main()
