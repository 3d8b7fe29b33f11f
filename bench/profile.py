"""Where the time goes: py-spy samples a worker (or the app process) while the end-to-end load
runs, and the samples are summed by component. Only samples of the thread holding the GIL are
kept (``--gil``): that is CPU spent in Python, what limits a threads-pool worker.

    python -m bench.profile [--path delivery|alone] [--pool threads:8] [--per-tx 100]
                            [--messages 3000] [--target worker|app]

Prints one JSON line: the share of busy samples per component (HTTP to the provider, the
database through SQLAlchemy/psycopg, the breaker, Celery/kombu, ...) and the top functions by
own time; the raw collapsed stacks are kept in ``bench/profiles/`` for a flame graph
(``py-spy`` / speedscope can read them). Needs ``pip install -e '.[bench]'`` (py-spy).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, fresh_database, log, session, wait_until
from bench.end_to_end import effects_total, produce_alone, produce_delivery

PROFILES = ROOT / "bench" / "profiles"

# (component, markers): the first component with a marker in the stack wins, checked in order.
COMPONENTS: list[tuple[str, tuple[str, ...]]] = [
    ("HTTP to the provider (httpx)", ("providers/http.py", "celery_alone.py:send", "httpx/")),
    ("circuit breaker (Redis)", ("delivery/guards/breaker",)),
    (
        "metrics hooks (Prometheus, created_at lookups)",
        ("delivery/observability/metrics.py", "delivery/worker/metrics.py"),
    ),
    ("transition events / logging", ("delivery/observability/events.py", "logging/")),
    (
        "post-commit nudge (claim + publish)",
        ("delivery/worker/publish.py:_nudge", "_nudge (delivery/worker/publish"),
    ),
    ("enqueue (outbox insert, validation)", ("delivery/outbox/enqueue.py",)),
    ("database (SQLAlchemy + psycopg)", ("sqlalchemy/", "psycopg/")),
    (
        "delivery.sending.sender other",
        (
            "delivery/sending/sender.py",
            "delivery/sending/settle.py",
            "delivery/sending/attempt.py",
            "delivery/transitions/",
        ),
    ),
    ("Celery / kombu / redis (task protocol, broker, events)", ("celery/", "kombu/", "redis/")),
]


def classify(stack: str) -> str:
    for name, markers in COMPONENTS:
        if any(m in stack for m in markers):
            return name
    return "other"


def summarise(raw: Path) -> dict[str, Any]:
    parts: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        parts[classify(stack)] += n
        leaves[stack.split(";")[-1]] += n
    return {
        "samples": total,
        "components": {k: round(v / total, 3) for k, v in parts.most_common()},
        "top_own_time": [[k, round(v / total, 3)] for k, v in leaves.most_common(12)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=("delivery", "alone"), default="delivery")
    parser.add_argument("--pool", default="threads:8")
    parser.add_argument("--per-tx", type=int, default=100)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--target", choices=("worker", "app"), default="worker")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    pool, concurrency = args.pool.split(":")
    PROFILES.mkdir(exist_ok=True)
    raw = PROFILES / f"{args.path}-{args.target}-{pool}{concurrency}-{args.per_tx}tx.txt"
    with session() as procs:
        import tasks  # noqa: F401  (the nudge)
        from bench import celery_alone

        engine = fresh_database()
        stub = procs.stub()
        app = "delivery.worker" if args.path == "delivery" else "bench.celery_alone"
        if args.path == "alone":
            celery_alone.app.conf.task_send_sent_event = False
        worker = procs.worker(app, pool=pool, concurrency=int(concurrency), name="profiled")
        if args.path == "delivery":
            procs.beat()
        produce = produce_delivery if args.path == "delivery" else produce_alone
        produce(engine, 50, "warm", args.per_tx)
        wait_until(lambda: effects_total(stub) >= 50, 60, 0.1, "warm-up")
        pid = worker.pid if args.target == "worker" else os.getpid()
        argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200"]
        argv += ["--output", str(raw), "--nonblocking", "--gil"]
        if pool == "prefork" and args.target == "worker":
            argv.append("--subprocesses")
        spy_proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)
        try:
            t0 = time.time()
            produce(engine, args.messages, "m", args.per_tx)
            wait_until(lambda: effects_total(stub) >= args.messages + 50, 600, 0.25, "effects")
            elapsed = time.time() - t0
        finally:
            spy_proc.send_signal(signal.SIGINT)
            spy_proc.wait(30)
        engine.dispose()
    summary = summarise(raw)
    result = {
        "bench": "profile",
        "path": args.path,
        "target": args.target,
        "pool": args.pool,
        "per_tx": args.per_tx,
        "messages": args.messages,
        "rate": round(args.messages / elapsed, 1),
        "raw": str(raw.relative_to(ROOT)),
        **summary,
    }
    log(json.dumps(result, indent=1))
    print(json.dumps(result, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
