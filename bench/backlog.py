"""A backlog of 10,000 messages due at once, workers slower than it (issue 12 §2): how many
deliver tasks the relay publishes per message; prints the rows for ``bench/RELIABILITY.md``.

    python -m bench.backlog [--n 10000] [--latency-ms 100] [--brokers redis,rabbitmq]
                            [--baseline DIR]

On a private cluster (``tests/chaos_cluster.py``) with the default settings (``DEFAULTS`` of
``tests/recovery.py``) and one worker of 8 threads against a provider answering in
``--latency-ms``: ``--n`` messages are enqueued for an hour later, then made due in one
UPDATE, and the run waits until every one is sent and the broker queue is empty. A message
merely waiting in a long backlog must not be published twice: the target is messages carried
by the deliver tasks the worker received (one per ``delivery.deliver``, the count of each
``delivery.deliver_batch`` from its result) <= 1.1x messages (each published task is received
once: nothing is killed here). Also counted: rows the sweeper put back to pending
(``requeued``: a task taken for lost), tasks that found nothing to do (``skipped``), and the
most rows ``dispatched`` at once (what back-pressure let out of the outbox).

``--baseline DIR`` runs the same scenario first with the worker and beat of an older tree
(``git archive 946b8ff | tar -x -C DIR``), with the same settings (so a 10 s dispatch lease
without the relay's renewal of waiting tasks), on the same cluster, in the same run. The load
average (1/5/15 min, ``os.getloadavg``) is printed beside each row.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import re
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import chaos_cluster, recovery  # noqa: E402
from tests.chaos import BATCH_DONE, Report, Run, all_sent  # noqa: E402
from tests.chaos_cluster import Cluster, Feeder  # noqa: E402

#: The target: deliver tasks published (received) per message.
TARGET = 1.1


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def backlog(cluster: Cluster, n: int, broker: str, latency_ms: int) -> Report:
    """``n`` messages due at once, one 8-thread worker at ``latency_ms`` per call."""
    report = Report("backlog", f"{n} messages due at once", broker, n)
    config = dataclasses.replace(recovery.DEFAULTS, concurrency=8)
    with cluster.pipeline(report.scenario, broker, config) as (pipe, settings):
        cluster.proxy.set(latency_ms=latency_ms)
        run = Run(cluster, pipe, settings, report)
        later = {"send_at": dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)}
        run.feeder = Feeder(
            cluster.db, settings, f"backlog-{broker}", n, 0.0, batch=250, options=lambda i: later
        ).start()
        run.feeder.join(600.0)
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                dispatched = cluster.scalar(
                    "SELECT count(*) FROM delivery_messages WHERE status = 'dispatched'"
                )
                peak[0] = max(peak[0], int(dispatched or 0))

        with cluster.db.begin() as conn:
            conn.execute(text("UPDATE delivery_messages SET next_attempt_at = clock_timestamp()"))
        started = time.monotonic()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        run.finish(all_sent, timeout=1800.0)
        drained = time.monotonic() - started
        chaos_cluster.wait_until(lambda: _queued(cluster, broker) == 0, 120, 0.5)
        time.sleep(3.0)  # the last tasks' log lines
        done.set()
        logs = pipe.logs_text()
        alone = len(re.findall(r"Task delivery\.deliver\[[^\]]+\] received", logs))
        skipped = len(re.findall(r"succeeded in [0-9.e-]+s: 'skipped", logs))
        # A batch task's result counts its messages by answer ("48 sent, 2 skipped").
        batches = re.findall(BATCH_DONE, logs)
        in_batches = sum(int(x) for b in batches for x in re.findall(r"\d+", b))
        skipped += sum(int(x) for b in batches for x in re.findall(r"(\d+) skipped", b))
        received = alone + in_batches
        requeued = sum(int(x) for x in re.findall(r"'requeued': (\d+)", logs))
        ratio = received / n
        report.figures.update(
            received=received,
            alone=alone,
            batch_tasks=len(batches),
            per_message=round(ratio, 3),
            requeued=requeued,
            skipped=skipped,
            peak_dispatched=peak[0],
            drain_s=round(drained, 1),
            msg_per_s=round(n / drained, 1),
        )
        report.check(ratio <= TARGET, f"{received} tasks for {n} messages ({ratio:.3f}x)")
    return report


def _queued(cluster: Cluster, broker: str) -> int:
    if broker == "redis":
        return int(cluster.redis.client(0).llen(chaos_cluster.QUEUE))
    from kombu import Connection

    with Connection(chaos_cluster.RABBITMQ_URL, connect_timeout=5) as conn:
        declared = conn.default_channel.queue_declare(queue=chaos_cluster.QUEUE, passive=True)
        return int(declared.message_count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=int, default=100)
    parser.add_argument("--brokers", default="redis,rabbitmq")
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args(argv)
    runs: list[tuple[str, str, Path]] = []
    brokers = args.brokers.split(",")
    if args.baseline is not None:
        runs.append(("before", brokers[0], args.baseline))
    runs += [("after", broker, ROOT) for broker in brokers]
    rows = []
    failed = False
    with Cluster() as cluster:
        for label, broker, tree in runs:
            if broker == "rabbitmq" and not Cluster.rabbitmq_reachable():
                print("RabbitMQ not reachable: skipped", file=sys.stderr)
                continue
            chaos_cluster.ROOT = tree  # the worker and beat run from this tree
            os.environ["PYTHONPATH"] = str(tree)
            before = _load()
            report = backlog(cluster, args.n, broker, args.latency_ms)
            print(report.summary(), file=sys.stderr, flush=True)
            f = report.figures
            failed |= label == "after" and not report.ok
            rows.append(
                f"| {label} | {broker} | {args.n} | {f['received']} ({f['alone']} alone, "
                f"{f['batch_tasks']} batches) | {f['per_message']} | "
                f"{f['requeued']} | {f['skipped']} | {f['peak_dispatched']} | {f['drain_s']} | "
                f"{f['msg_per_s']} | {report.lost} | {report.duplicates} | "
                f"{before} -> {_load()} |"
            )
    print(
        "| code | broker | messages | messages in deliver tasks | per message | "
        "requeued by sweeper | skipped | peak dispatched | drain (s) | msg/s | lost | "
        "duplicate effects | load average (before -> after) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
