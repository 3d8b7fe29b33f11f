"""Relay publish rate: 20,000 due rows published by the relay (claim + ``delivery.worker.publish``,
which sends each task with ``apply_async`` on one held producer and, on Redis, one pipeline
per call), rows per second, next to a plain loop of ``apply_async`` on the same broker in the
same run.

Each round starts from a fresh outbox of due rows and an empty broker db; the relay runs
``relay_once`` with the configured claim batch (500) until every row is published, then reads
the whole queue back and checks that it carries every row's (id, key) exactly once. The relay
runs twice per round: with the default ``batch_size`` (a backlog travels as
``delivery.deliver_batch`` tasks of up to 50 messages) and with ``batch_size = 1`` (one
``delivery.deliver`` task per row, the shape before batches, which the nudge still sends for a
few rows). The baselines publish the same 20,000 ``delivery.deliver`` tasks (same args, task
id = key) with ``apply_async``: one call per task, as an app would, with sent events off
(Celery's default) and on (as ``delivery.worker.app`` configures them, and as ``publish``
sends them). A third relay row publishes with ``apply_async`` per row on a held producer but
no pipeline: what the pipeline saves. The median of ``--rounds`` rounds is reported; the
ratios are against the faster baseline.

    python -m bench.relay_publish [--rows 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import redis
from sqlalchemy import text

from bench.common import (
    BROKER_URL,
    fresh_database,
    insert_rows,
    log,
    median,
    report,
    row,
    session,
    truncate,
    vacuum,
)
from delivery.config.loading import load_settings
from delivery.relay.claims import Claim, relay_once
from delivery.runtime.current import configure
from delivery.worker.app import QUEUE, app
from delivery.worker.deliver import deliver
from delivery.worker.publish import publish


def publish_via_apply_async(claims: Sequence[Claim]) -> None:
    """``apply_async`` per row on a held producer, without ``publish``'s pipeline (and batches)."""
    with app.producer_or_acquire() as producer:
        for claim in claims:
            deliver.apply_async(
                (claim.id, claim.key), task_id=claim.key, producer=producer, queue=QUEUE
            )


def _fresh(engine: Any, rows: int) -> list[tuple[int, str]]:
    import redis as _redis

    _redis.Redis.from_url(BROKER_URL).delete(QUEUE)
    truncate(engine)
    insert_rows(engine, rows)
    vacuum(engine)
    with engine.connect() as conn:
        return [(r.id, r.key) for r in conn.execute(text("SELECT id, key FROM delivery_messages"))]


def _queued() -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in redis.Redis.from_url(BROKER_URL).lrange(QUEUE, 0, -1)]


def _carried(message: dict[str, Any]) -> list[tuple[int, str]]:
    """The (id, key) pairs one queued task carries: one for ``delivery.deliver``, the batch's
    for ``delivery.deliver_batch``."""
    args = json.loads(base64.b64decode(message["body"]))[0]
    if message["headers"]["task"] == "delivery.deliver":
        return [(args[0], args[1])]
    assert message["headers"]["task"] == "delivery.deliver_batch", message["headers"]
    return [(pair[0], pair[1]) for pair in args[0]]


def _check_queue(expect: dict[int, str]) -> int:
    """Every row's (id, key) is in the queue exactly once; return the number of tasks."""
    queued = _queued()
    carried = [pair for message in queued for pair in _carried(message)]
    if len(carried) != len(expect) or dict(carried) != expect:
        raise AssertionError(
            f"queue carries {len(carried)} messages ({len(dict(carried))} distinct) in "
            f"{len(queued)} tasks, expected the {len(expect)} rows"
        )
    return len(queued)


def _check_message(expect_rows: dict[int, str]) -> dict[str, Any]:
    """Decode the newest task in the queue: the worker reads these fields."""
    raw = redis.Redis.from_url(BROKER_URL).lindex(QUEUE, 0)
    assert raw is not None
    message = json.loads(raw)
    headers = message["headers"]
    body = json.loads(base64.b64decode(message["body"]))
    (message_id, key), kwargs, embed = body
    assert headers["task"] == "delivery.deliver", headers
    assert headers["id"] == key == message["properties"]["correlation_id"], message
    assert expect_rows[message_id] == key and kwargs == {}, body
    assert set(embed) == {"callbacks", "errbacks", "chain", "chord"}, embed
    return {"headers": sorted(headers), "args": [message_id, key]}


def check_same_as_apply_async() -> None:
    """``publish`` sends the very message a plain ``apply_async`` sends (but the delivery
    tag): its options change nothing the worker reads."""
    client = redis.Redis.from_url(BROKER_URL)
    client.delete(QUEUE)
    app.conf.task_send_sent_event = False
    try:
        deliver.apply_async((5, "k5"), task_id="k5")
    finally:
        app.conf.task_send_sent_event = True
    publish([Claim(5, "k5")])
    sent = [json.loads(raw) for raw in client.lrange(QUEUE, 0, -1)]
    client.delete(QUEUE)
    for message in sent:
        message["properties"].pop("delivery_tag")
    if sent[0] != sent[1]:
        raise AssertionError(f"publish differs from apply_async:\n{sent[1]}\n{sent[0]}")


def time_relay(
    engine: Any,
    rows: int,
    publisher: Callable[[Sequence[Claim]], object],
    batch_size: int | None = None,
) -> tuple[float, int]:
    """Rows/s of one relay pass over ``rows`` due rows, and the tasks it queued; with
    ``batch_size``, the relay's process runs with that setting instead of the default."""
    ids = dict(_fresh(engine, rows))
    configure(replace(load_settings(), batch_size=batch_size) if batch_size else None)
    try:
        start = time.perf_counter()
        published = relay_once(engine, publisher, batch=500, lease=300, max_batches=10**6)
        elapsed = time.perf_counter() - start
    finally:
        configure(None)
    assert published == rows, published
    tasks = _check_queue(ids)
    if tasks == rows:
        _check_message(ids)
    return rows / elapsed, tasks


def time_apply_async(engine: Any, rows: int, sent_events: bool) -> float:
    pairs = _fresh(engine, rows)
    app.conf.task_send_sent_event = sent_events
    try:
        start = time.perf_counter()
        for message_id, key in pairs:
            deliver.apply_async((message_id, key), task_id=key)
        elapsed = time.perf_counter() - start
    finally:
        app.conf.task_send_sent_event = True
    _check_queue(dict(pairs))
    return rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {
        "relay": [],
        "relay_single": [],
        "apply_async": [],
        "apply_async_sent_events": [],
        "relay_no_pipeline": [],
    }
    with session():
        engine = fresh_database()
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)
        check_same_as_apply_async()
        log("warm-up")
        time_relay(engine, 2000, publish)
        time_apply_async(engine, 2000, sent_events=False)
        for n in range(args.rounds):
            log(f"round {n + 1}/{args.rounds}")
            rate, tasks = time_relay(engine, args.rows, publish)
            rates["relay"].append(rate)
            rates["relay_single"].append(time_relay(engine, args.rows, publish, 1)[0])
            rates["apply_async"].append(time_apply_async(engine, args.rows, sent_events=False))
            rates["apply_async_sent_events"].append(
                time_apply_async(engine, args.rows, sent_events=True)
            )
            rates["relay_no_pipeline"].append(
                time_relay(engine, args.rows, publish_via_apply_async)[0]
            )
            log("  " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items()))
        figures: dict[str, Any] = {k: round(median(v)) for k, v in rates.items()}
        figures["rounds"] = {k: [round(x) for x in v] for k, v in rates.items()}
        figures["rows"] = args.rows
        figures["batch_tasks"] = tasks
        relay = median(rates["relay"])
        single = median(rates["relay_single"])
        plain = median(rates["apply_async"])
        events = median(rates["apply_async_sent_events"])
        old = median(rates["relay_no_pipeline"])
        baseline = max(plain, events)
        figures["ratio"] = round(relay / baseline, 3)
        rows = [
            row(
                f"relay publish, {args.rows:,} due rows",
                relay / baseline,
                ">= 3x",
                relay / baseline >= 3.0,
                f"{relay:,.0f} rows/s ({tasks:,} tasks)",
                f"apply_async loop {plain:,.0f}/s (sent events on: {events:,.0f}/s)",
            ),
            row(
                # apply_async per task, as the baseline: the held producer and the pipeline
                # are all it saves, so it must not be slower than the loop.
                "relay publish, one task per row (batch_size = 1)",
                single / baseline,
                ">= 1x",
                single / baseline >= 1.0,
                f"{single:,.0f} rows/s",
                "same baseline",
            ),
            row(
                "relay with apply_async per row, held producer, no pipeline",
                old / baseline,
                "",
                None,
                f"{old:,.0f} rows/s",
                "same baseline",
            ),
        ]
        report("relay_publish", figures, rows, engine)
        engine.dispose()


if __name__ == "__main__":
    main()
