"""Recovery after a worker is killed, with the default settings (issue 12 §2).

``held_by_killed_worker`` runs one worker (4 threads, so it prefetches 16 tasks besides the 4
it runs) against a slow provider, SIGKILLs its process group while it holds messages, starts a
new worker, and measures how long after the kill every message that was open at the kill is
sent. ``tests/test_recovery.py`` asserts on it (30 s at most, on Redis and on RabbitMQ, one
effect per key); ``bench/recovery.py`` writes its figures to ``bench/RELIABILITY.md``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import fields
from pathlib import Path

from delivery.config.settings import BreakerConfig, Settings, Timeouts
from delivery.core.models import utcnow
from tests.chaos import Report, Run, all_sent
from tests.chaos_cluster import ChaosConfig, Cluster, Feeder, wait_until

__all__ = [
    "BLOCKED",
    "DEFAULTS",
    "held_by_killed_worker",
    "killed_right_after_receipt",
    "relay_with_blocked_slots",
]


def _default(cls: type, name: str) -> float:
    return float(next(f.default for f in fields(cls) if f.name == name))


#: The product's defaults (read from the settings classes, so that this follows them), with a
#: worker of 4 threads: nothing tuned for the test.
DEFAULTS = ChaosConfig(
    max_attempts=int(_default(Settings, "max_attempts")),
    backoff_base=1.0,
    backoff_cap=300.0,
    relay_interval=_default(Settings, "relay_interval"),
    sweep_interval=_default(Settings, "sweep_interval"),
    dispatch_lease=_default(Settings, "dispatch_lease"),
    send_lease=_default(Settings, "send_lease"),
    connect=_default(Timeouts, "connect"),
    write=_default(Timeouts, "write"),
    read=_default(Timeouts, "read"),
    pool=_default(Timeouts, "pool"),
    breaker_reset=_default(BreakerConfig, "reset_timeout"),
    concurrency=4,
)

#: The promise: a killed worker's messages are all sent within this many seconds of the kill.
BOUND_S = 30.0


def held_by_killed_worker(cluster: Cluster, n: int, broker: str = "redis") -> Report:
    """SIGKILL a worker holding prefetched and in-flight messages (default settings); every
    message open at the kill must be sent within ``BOUND_S`` of it, each key once."""
    report = Report("held-by-killed-worker", "worker SIGKILLed holding messages", broker, n)
    with cluster.pipeline(report.scenario, broker, DEFAULTS) as (pipe, settings):
        cluster.proxy.set(latency_ms=500)  # slow sends: the worker holds what it prefetched
        run = Run(cluster, pipe, settings, report)
        run.feed(1.0)
        assert run.feeder is not None
        run.feeder.join()
        # Kill once everything is published and the worker is busy sending (two rounds of
        # sends done): it then holds its running sends and up to 16 prefetched tasks.
        busy = wait_until(
            lambda: bool(
                cluster.scalar(
                    "SELECT count(*) FILTER (WHERE status = 'sending') >= 3 "
                    "AND count(*) FILTER (WHERE status = 'sent') >= 8 "
                    "AND count(*) FILTER (WHERE status = 'pending') = 0 FROM delivery_messages"
                )
            ),
            30,
            0.05,
        )
        time.sleep(0.25)  # mid-send (the instant after a receipt: killed_right_after_receipt)
        open_at_kill = int(
            cluster.scalar(
                "SELECT count(*) FROM delivery_messages WHERE status IN "
                "('pending', 'dispatched', 'sending')"
            )
            or 0
        )
        held_ids = list(
            cluster.scalar(
                "SELECT coalesce(array_agg(id), '{}') FROM delivery_messages "
                "WHERE status IN ('dispatched', 'sending')"
            )
            or []
        )
        held = len(held_ids)
        killed_at = utcnow()
        kill_clock = time.monotonic()
        pipe.kill_worker()
        time.sleep(0.5)
        pipe.start_worker()
        run.recovered()
        run.finish(all_sent, timeout=BOUND_S + 150.0)
        last_sent = cluster.scalar(
            "SELECT max(updated_at) FROM delivery_messages WHERE status = 'sent'"
        )
        after = (last_sent - killed_at).total_seconds() if last_sent is not None else None
        report.recovery_s = None if after is None else round(after, 1)
        report.faults = (
            f"SIGKILL with {held} messages dispatched or sending, {open_at_kill} open in all; "
            f"a new worker started 0.5 s later"
        )
        held_sent = cluster.scalar(
            "SELECT max(updated_at) FROM delivery_messages WHERE id = ANY(:ids)", ids=held_ids
        )
        report.figures.update(
            open_at_kill=open_at_kill,
            held_at_kill=held,
            last_held_sent_after_kill_s=(
                None if held_sent is None else round((held_sent - killed_at).total_seconds(), 1)
            ),
            last_sent_after_kill_s=report.recovery_s,
            wall_s=round(time.monotonic() - kill_clock, 1),
            lease_expired_attempts=int(
                cluster.scalar(
                    "SELECT count(*) FROM delivery_attempts WHERE error_code = 'LEASE_EXPIRED'"
                )
                or 0
            ),
        )
        report.check(busy, "the worker never had 3 sends in flight: the kill hit nothing")
        report.check(held >= 8, f"only {held} messages held at the kill: nothing to recover")
        report.check(
            after is not None and after <= BOUND_S,
            f"the last message was sent {after} s after the kill (bound {BOUND_S:g} s)",
        )
    return report


def killed_right_after_receipt(cluster: Cluster, n: int = 6, broker: str = "redis") -> Report:
    """A worker stops itself the instant it receives its first task, before its lease keeper
    hears of it (``tests/freeze_on_receipt.py``), and is then SIGKILLed: that message was never
    renewed by a worker, so only the relay's ``dispatch_lease`` brings it back. Every message
    must still be sent within ``BOUND_S`` of the kill by a new worker, each key once."""
    report = Report("killed-after-receipt", "worker SIGKILLed right after a receipt", broker, n)
    with cluster.pipeline(report.scenario, broker, DEFAULTS, start=False) as (pipe, settings):
        pipe.start_worker(extra=("--include", "tests.freeze_on_receipt"))
        pipe.start_beat()
        run = Run(cluster, pipe, settings, report)
        run.feed(0.0)
        assert run.feeder is not None
        run.feeder.join()
        assert pipe.worker is not None
        pid = pipe.worker.pid
        frozen = wait_until(lambda: _stopped(pid), 60, 0.05)
        time.sleep(2.0)  # let the relay and the sweeper run their passes meanwhile
        dispatched = int(
            cluster.scalar("SELECT count(*) FROM delivery_messages WHERE status = 'dispatched'")
            or 0
        )
        killed_at = utcnow()
        pipe.kill_worker()
        pipe.start_worker()
        run.recovered()
        run.finish(all_sent, timeout=BOUND_S + 150.0)
        last_sent = cluster.scalar(
            "SELECT max(updated_at) FROM delivery_messages WHERE status = 'sent'"
        )
        after = (last_sent - killed_at).total_seconds() if last_sent is not None else None
        report.recovery_s = None if after is None else round(after, 1)
        report.faults = (
            f"worker stopped on its first receipt, SIGKILLed 2 s later with {dispatched} "
            "messages dispatched; a new worker started at once"
        )
        report.figures.update(dispatched_at_kill=dispatched, last_sent_after_kill_s=after)
        report.check(frozen, "the worker never stopped on a receipt: the kill hit nothing")
        report.check(dispatched >= 1, "no message was dispatched at the kill")
        report.check(
            after is not None and after <= BOUND_S,
            f"the last message was sent {after} s after the kill (bound {BOUND_S:g} s)",
        )
    return report


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): ``T`` in its /proc status."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return any(line.startswith("State:") and "T" in line.split()[1] for line in status.splitlines())


#: Every worker slot blocked: 20 s provider calls (read timeout 30 s), 2 threads.
BLOCKED = ChaosConfig(
    **{
        **{f.name: getattr(DEFAULTS, f.name) for f in fields(DEFAULTS)},
        "read": 30.0,
        "concurrency": 2,
    }
)
BLOCKED_CALL_MS = 20_000


def relay_with_blocked_slots(cluster: Cluster, broker: str = "redis") -> Report:
    """With both worker slots (and their prefetch) stuck in 20 s provider calls, a message
    enqueued afterwards is still claimed and published by beat's relay within a few seconds
    (its task waits in the broker queue), and no relay or sweep task ever reaches a worker."""
    n = 12  # 2 running, 8 prefetched, 2 waiting in the queue
    report = Report("relay-blocked-slots", "every worker slot blocked", broker, n + 1)
    with cluster.pipeline(report.scenario, broker, BLOCKED) as (pipe, settings):
        cluster.proxy.set(latency_ms=BLOCKED_CALL_MS)
        run = Run(cluster, pipe, settings, report)
        run.feed(0.5)
        assert run.feeder is not None
        run.feeder.join()
        full = wait_until(
            lambda: (
                int(
                    cluster.scalar(
                        "SELECT count(*) FROM delivery_messages WHERE status = 'sending'"
                    )
                    or 0
                )
                >= 2
            ),
            30,
            0.05,
        )
        late = Feeder(cluster.db, settings, "late", 1, 0.0).start().join()
        key = late.keys[0]
        enqueued = time.monotonic()
        queued = wait_until(lambda: key in _queued_keys(cluster), 30, 0.1)
        report.figures["claimed_and_published_s"] = round(time.monotonic() - enqueued, 2)
        status = cluster.scalar("SELECT status FROM delivery_messages WHERE key = :k", k=key)
        sending = int(
            cluster.scalar("SELECT count(*) FROM delivery_messages WHERE status = 'sending'") or 0
        )
        tasks_run = re.findall(r"delivery\.(?:relay|sweep)\[", pipe.logs_text())
        report.figures.update(late_status=status, sending_when_published=sending)
        report.check(full, "the worker's slots were never all busy")
        report.check(queued, f"the late message's task never reached the broker ({status})")
        report.check(status == "dispatched", f"the late message is {status}, not dispatched")
        report.check(sending >= 2, f"only {sending} slots were busy when it was published")
        report.check(not tasks_run, f"{len(tasks_run)} relay or sweep tasks reached the worker")
        report.statuses = {status or "missing": 1}
    return report


def _queued_keys(cluster: Cluster) -> set[str]:
    """Task ids (message keys) waiting in the Redis broker's ``delivery`` queue."""
    keys = set()
    for raw in cluster.redis.client(0).lrange("delivery", 0, -1):
        keys.add(str(json.loads(raw).get("headers", {}).get("id")))
    return keys
