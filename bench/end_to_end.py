"""End to end: 5,000 messages from the app's committed transactions to the provider's accept,
through ``delivery`` (outbox, post-commit nudge, relay on beat, worker) and through Celery
alone (``apply_async`` after the commit, a task that POSTs with httpx), with the same worker
pool and concurrency, in the same run. Both the prefork and the threads pool.

Each message is its own app transaction that inserts one business row (``bench_orders``):
``delivery`` enqueues inside it; Celery alone calls ``apply_async`` after it commits. The
clock runs from the first transaction to the stub's last accept (its request log); delivered
per second = messages / that time. Every run starts new workers on an empty outbox and broker,
after a 100-message warm-up, and checks that every key took effect exactly once.

    python -m bench.end_to_end [--messages 5000] [--pools prefork:4,threads:8] [--matched]
    python -m bench.end_to_end --backlog [--messages 5000] [--pools prefork:2,threads:4]

``--matched`` adds a third path: Celery alone with the settings ``delivery.worker.app`` uses
(late acks, task events, sent events, track started), to separate their cost from the outbox's.

``--backlog`` (issue 13): the app commits all the messages in one transaction (delivery:
``enqueue_many``, the nudge off, so that beat's relay drains a backlog; Celery alone:
``apply_async`` for each right after the commit), and the clock runs from the commit's start
to the last accept. Per pool, in the same run: Celery alone, ``delivery`` with one message per
task (``batch_size = 1``: the path before batches), with the default batches, and with the
default batches but no task events (what Flower's per-message events cost). CPU per
delivered message is split per process: worker (and its pool children), PostgreSQL backends,
beat, app.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from bench import celery_alone
from bench.common import (
    CONFIG,
    PG_URL,
    SINGLE_CONFIG,
    CpuMeter,
    Order,
    Processes,
    children,
    database_backends,
    flush_redis,
    fresh_database,
    log,
    report,
    row,
    session,
    truncate,
    wait_until,
)
from delivery import enqueue, enqueue_many
from delivery.core.models import Message
from delivery.outbox import enqueue as outbox
from delivery.runtime.db import make_engine
from delivery.worker import app as _tasks  # noqa: F401  (after bench.common: installs the nudge here)


def to(i: int) -> str:
    return f"+1201555{i % 10000:04d}"


def produce_delivery(engine: Any, n: int, prefix: str, per_tx: int = 1) -> None:
    for first in range(0, n, per_tx):
        with Session(engine) as s, s.begin():
            for i in range(first, min(first + per_tx, n)):
                s.add(Order(ref=f"{prefix}-{i}", amount=i))
                enqueue(
                    s, channel="sms", to=to(i), payload={"body": f"code {i}"}, key=f"{prefix}-{i}"
                )


def produce_alone(engine: Any, n: int, prefix: str, per_tx: int = 1) -> float:
    """Commit the business rows ``per_tx`` at a time, ``apply_async`` for each after its
    commit; return when the first transaction's rows were flushed (where ``delivery``'s first
    ``enqueue`` would be)."""
    clock = 0.0
    for first in range(0, n, per_tx):
        with Session(engine) as s, s.begin():
            orders = [
                Order(ref=f"{prefix}-{i}", amount=i) for i in range(first, min(first + per_tx, n))
            ]
            s.add_all(orders)
            s.flush()
            ids = [order.id for order in orders]
            clock = clock or time.time()
        for i, order_id in zip(range(first, first + len(ids)), ids, strict=True):
            celery_alone.send.apply_async((order_id, to(i), {"body": f"code {i}"}, f"{prefix}-{i}"))
    return clock


def effects_total(stub: Any) -> int:
    return int(stub._http.get("/_stub/effects").json()["total"])


def one_run(
    engine: Any,
    procs: Processes,
    stub: Any,
    stub_pid: int,
    *,
    path: str,
    pool: str,
    concurrency: int,
    messages: int,
    per_tx: int,
) -> dict[str, Any]:
    truncate(engine)
    flush_redis()
    stub.reset()
    monitor = make_engine(PG_URL, pool_size=1, max_overflow=0)
    produce: Callable[[Any, int, str, int], object]
    started = []
    if path == "delivery":
        worker = procs.worker("delivery.worker", pool=pool, concurrency=concurrency, name="e2e")
        started.append(worker)
        started.append(procs.beat())
        produce = produce_delivery
    else:
        matched = path == "alone_matched"
        env = {"BENCH_ALONE_MATCHED": "1" if matched else "0"}
        celery_alone.app.conf.task_send_sent_event = matched
        started.append(
            procs.worker(
                "bench.celery_alone", pool=pool, concurrency=concurrency, name="e2e", env=env
            )
        )
        produce = produce_alone
    try:
        produce(engine, 100, "warm", per_tx)
        wait_until(lambda: effects_total(stub) >= 100, 60, 0.1, "warm-up")
        truncate(engine)
        stub.reset()
        time.sleep(0.5)

        worker = started[0]
        meter = CpuMeter(
            {
                "worker": lambda: [worker.pid, *children(worker.pid)],
                "app": lambda: [os.getpid()],
                "postgres": lambda: database_backends(monitor),
                "stub": lambda: [stub_pid],
                "beat": lambda: [p.pid for p in started[1:]],
            }
        )
        meter.start()
        t0 = time.time()
        produce(engine, messages, "m", per_tx)
        produced = time.time() - t0
        wait_until(lambda: effects_total(stub) >= messages, 600, 0.5, f"{messages} effects")
        cpu = meter.stop()
        accepts = [r["at"] for r in stub.requests() if r["outcome"] == "effect"]
        effects = stub.effects()
        assert len(effects) == messages and set(effects.values()) == {1}, "not once per key"
        if path == "delivery":
            with Session(engine) as s:
                sent = s.scalar(select(func.count()).where(Message.status == "sent"))
            assert sent == messages, sent
    finally:
        for proc in reversed(started):
            procs.stop(proc)
        monitor.dispose()
    total = max(accepts) - t0
    return {
        "rate": round(messages / total, 1),
        "seconds": round(total, 3),
        "producer_seconds": round(produced, 3),
        "producer_rate": round(messages / produced, 1),
        "cpu_ms_per_message": {k: round(v * 1000 / messages, 3) for k, v in cpu.items()},
    }


def produce_backlog(engine: Any, n: int, prefix: str, path: str) -> None:
    """All ``n`` messages committed in one app transaction (one business row each)."""
    if path == "alone":
        produce_alone(engine, n, prefix, n)
        return
    nudge = outbox._nudge
    outbox.set_nudge(None)  # the relay drains the backlog
    try:
        with Session(engine) as s, s.begin():
            s.add_all([Order(ref=f"{prefix}-{i}", amount=i) for i in range(n)])
            specs = (
                dict(channel="sms", to=to(i), payload={"body": f"code {i}"}, key=f"{prefix}-{i}")
                for i in range(n)
            )
            enqueue_many(s, specs)
    finally:
        outbox.set_nudge(nudge)


#: Commits ``n`` messages keyed by ``prefix``; may return when the clock starts (``time.time()``).
Produce = Callable[[Any, int, str], float | None]

#: The backlog runs: (label, path, batch configuration, task events).
BACKLOG_RUNS = [
    ("alone", "alone", None, True),
    ("single", "delivery", SINGLE_CONFIG, True),
    ("batch", "delivery", CONFIG, True),
    ("batch_no_events", "delivery", CONFIG, False),
]


def backlog_run(
    engine: Any,
    procs: Processes,
    stub: Any,
    stub_pid: int,
    *,
    run: tuple[str, str, Any, bool],
    pool: str,
    concurrency: int,
    messages: int,
    produce: Produce | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One run of ``run`` (label, path, configuration, task events) on new processes: a
    100-message warm-up, then ``messages`` committed by ``produce`` (by default
    ``produce_backlog``; it may return when the clock starts, else it starts at the call)
    until the stub's last accept. ``env``: more variables for the worker and beat."""
    label, path, config, events = run

    def backlog(engine: Any, n: int, prefix: str) -> float | None:
        produce_backlog(engine, n, prefix, path)
        return None

    commit = produce or backlog
    truncate(engine)
    flush_redis()
    stub.reset()
    monitor = make_engine(PG_URL, pool_size=1, max_overflow=0)
    env = {**(env or {}), "BENCH_NO_EVENTS": "0" if events else "1"}
    started = []
    if path == "delivery":
        env["DELIVERY_CONFIG"] = str(config)
        started.append(
            procs.worker("delivery.worker", pool=pool, concurrency=concurrency, name="e2e", env=env)
        )
        started.append(procs.beat(env))
    else:
        celery_alone.app.conf.task_send_sent_event = False
        env["BENCH_ALONE_MATCHED"] = "0"
        started.append(
            procs.worker(
                "bench.celery_alone", pool=pool, concurrency=concurrency, name="e2e", env=env
            )
        )
    try:
        commit(engine, 100, "warm")
        wait_until(lambda: effects_total(stub) >= 100, 60, 0.1, "warm-up")
        truncate(engine)
        stub.reset()
        time.sleep(1.0)
        worker = started[0]
        meter = CpuMeter(
            {
                "worker": lambda: [worker.pid, *children(worker.pid)],
                "app": lambda: [os.getpid()],
                "postgres": lambda: database_backends(monitor),
                "beat": lambda: [p.pid for p in started[1:]],
                "stub": lambda: [stub_pid],
            }
        )
        load = os.getloadavg()
        meter.start()
        t0 = time.time()
        t0 = commit(engine, messages, "m") or t0
        app_seconds = time.time() - t0
        wait_until(lambda: effects_total(stub) >= messages, 900, 0.5, f"{messages} effects")
        cpu = meter.stop()
        accepts = [r["at"] for r in stub.requests() if r["outcome"] == "effect"]
        effects = stub.effects()
        assert len(effects) == messages and set(effects.values()) == {1}, "not once per key"
    finally:
        for proc in reversed(started):
            procs.stop(proc)
        monitor.dispose()
    total = max(accepts) - t0
    per = {k: round(v * 1000 / messages, 3) for k, v in cpu.items()}
    return {
        "run": label,
        "rate": round(messages / total, 1),
        "seconds": round(total, 3),
        "app_seconds": round(app_seconds, 3),
        "first_accept_seconds": round(min(accepts) - t0, 3),
        "cpu_ms_per_message": per,
        "cpu_ms_total": round(sum(v for k, v in per.items() if k != "stub"), 3),
        "load": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def _split(result: dict[str, Any]) -> str:
    cpu = result["cpu_ms_per_message"]
    return (
        f"{result['rate']:,.0f} msg/s; CPU ms/msg {result['cpu_ms_total']:.2f} (worker "
        f"{cpu['worker']:.2f}, PostgreSQL {cpu['postgres']:.2f}, beat {cpu['beat']:.2f}, app "
        f"{cpu['app']:.2f}); load {' '.join(f'{x:.2f}' for x in result['load'])}"
    )


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate of ``runs`` (an odd count), with every round's rate."""
    ordered = sorted(runs, key=lambda r: r["rate"])
    middle = dict(ordered[len(ordered) // 2])
    middle["rounds"] = [r["rate"] for r in runs]
    return middle


def backlog_main(
    messages: int,
    pools: list[tuple[str, int]],
    only: frozenset[str] | None = None,
    rounds: int = 3,
) -> None:
    """Per pool: ``alone`` and ``batch`` in ``rounds`` alternating pairs (the ratio is of
    their medians: two runs of one path, minutes apart, differ by up to 1.5x on 2 shared
    cores), then ``single`` and ``batch_no_events`` once each."""
    figures: dict[str, Any] = {"messages": messages, "mode": "backlog", "rounds": rounds}
    rows = []
    runs = {run[0]: run for run in BACKLOG_RUNS if only is None or run[0] in only}
    paired = [name for name in ("alone", "batch") if name in runs]
    once = [name for name in runs if name not in paired]
    with session() as procs:
        engine = fresh_database()
        stub = procs.stub()
        stub_pid = procs.pids()[-1]
        for pool, concurrency in pools:
            done: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
            schedule = [
                name
                for r in range(rounds)
                for name in (paired if r % 2 == 0 else list(reversed(paired)))
            ] + once
            for name in schedule:
                log(f"backlog {messages}, {pool} x{concurrency}: {name}")
                result = backlog_run(
                    engine,
                    procs,
                    stub,
                    stub_pid,
                    run=runs[name],
                    pool=pool,
                    concurrency=concurrency,
                    messages=messages,
                )
                log(f"  {result}")
                done[name].append(result)
            results = {name: _median_run(got) for name, got in done.items() if got}
            figures[f"backlog {pool}:{concurrency}"] = results
            if only is not None:  # a partial run (diagnosis): no table rows
                continue
            alone, batch = results["alone"], results["batch"]
            single, quiet = results["single"], results["batch_no_events"]
            what = f"{messages:,}-message backlog, {pool} x{concurrency}"
            pairs = ", ".join(
                f"{b:,.0f}/{a:,.0f}" for b, a in zip(batch["rounds"], alone["rounds"], strict=True)
            )
            rows.append(
                row(
                    f"end to end, {what} (median of {rounds} alternating pairs)",
                    batch["rate"] / alone["rate"],
                    ">= 1.5x (aim 2.5x)",
                    batch["rate"] / alone["rate"] >= 1.5,
                    f"{_split(batch)}; rounds batch/alone msg/s {pairs}",
                    f"Celery alone {_split(alone)}",
                )
            )
            rows.append(
                row(
                    f"CPU per delivered message, all processes, {what}",
                    batch["cpu_ms_total"] / alone["cpu_ms_total"],
                    "<= 1.0x",
                    batch["cpu_ms_total"] / alone["cpu_ms_total"] <= 1.0,
                    f"batches: {batch['cpu_ms_total']:.2f} ms",
                    f"Celery alone {alone['cpu_ms_total']:.2f} ms; before (batch_size 1): "
                    f"{_split(single)}",
                )
            )
            rows.append(
                row(
                    f"Flower's per-message task events, {what}",
                    quiet["rate"] / batch["rate"],
                    "(cost)",
                    None,
                    f"events on {_split(batch)}",
                    f"events off {_split(quiet)} (one run)",
                )
            )
        if only is None:
            report("end_to_end_backlog", figures, rows, engine)
        else:
            print(json.dumps(figures))
        engine.dispose()


def _described(result: dict[str, Any]) -> str:
    cpu = result["cpu_ms_per_message"]
    return (
        f"app side {result['producer_rate']:,.0f}/s; CPU ms/msg: worker {cpu['worker']:.2f}, "
        f"PostgreSQL {cpu['postgres']:.2f}, app {cpu['app']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--pools", default="prefork:4,threads:8")
    parser.add_argument(
        "--per-tx", default="100,1", help="messages per app transaction, one run each"
    )
    parser.add_argument("--matched", action="store_true")
    parser.add_argument("--backlog", action="store_true", help="issue 13's backlog runs")
    parser.add_argument(
        "--runs", default=None, help="--backlog: only these runs (alone,single,batch,...)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="--backlog: alternating alone/batch pairs (odd)"
    )
    args = parser.parse_args()
    if args.backlog and args.pools == parser.get_default("pools"):
        args.pools = "prefork:2,threads:4"
    pools = [(p, int(c)) for p, c in (spec.split(":") for spec in args.pools.split(","))]
    if args.backlog:
        only = frozenset(args.runs.split(",")) if args.runs else None
        backlog_main(args.messages, pools, only, args.rounds)
        return
    modes = [int(n) for n in args.per_tx.split(",")]
    paths = ["alone", "delivery"] + (["alone_matched"] if args.matched else [])
    figures: dict[str, Any] = {"messages": args.messages}
    rows = []
    with session() as procs:
        engine = fresh_database()
        stub = procs.stub()
        stub_pid = procs.pids()[-1]
        index = 0
        for per_tx in modes:
            for pool, concurrency in pools:
                order = paths if index % 2 == 0 else list(reversed(paths))
                index += 1
                results = {}
                for path in order:
                    log(f"{per_tx}/tx, {pool} x{concurrency}: {path}")
                    results[path] = one_run(
                        engine,
                        procs,
                        stub,
                        stub_pid,
                        path=path,
                        pool=pool,
                        concurrency=concurrency,
                        messages=args.messages,
                        per_tx=per_tx,
                    )
                    log(f"  {results[path]}")
                figures[f"{per_tx}/tx {pool}:{concurrency}"] = results
                ours, alone = results["delivery"]["rate"], results["alone"]["rate"]
                extra = ""
                if "alone_matched" in results:
                    matched = results["alone_matched"]["rate"]
                    extra = f"; with delivery.worker.app's settings {matched:,.0f}/s"
                app_ours = _described(results["delivery"])
                app_alone = _described(results["alone"])
                rows.append(
                    row(
                        f"end to end, {args.messages:,} msgs, {per_tx} per app transaction, "
                        f"{pool} x{concurrency}",
                        ours / alone,
                        ">= 0.9x (aim 1.0x)",
                        ours / alone >= 0.9,
                        f"{ours:,.0f} msg/s ({app_ours})",
                        f"{alone:,.0f} msg/s ({app_alone}){extra}",
                    )
                )
        report("end_to_end", figures, rows, engine)
        engine.dispose()


if __name__ == "__main__":
    main()
