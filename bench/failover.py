"""Failover latency (issue 27): how long an OTP takes from the app's commit to a provider's
accept while its first provider is down, next to the same OTPs with it healthy, in the same run.

Two stub providers in their own processes, ``primary`` and ``backup``. The sms channel routes
``providers = ["primary", "backup"]``; the ``otp`` type is the example configuration's (urgent,
10 attempts, backoff 0.5-20 s, time-to-live 300 s) with ``failover_after`` (5 s). Everything
else is the product's defaults, the breakers' too. Each phase starts a new worker (threads x8)
and beat on an empty outbox and Redis, sends ``WARM_UP`` OTPs untimed with both providers up,
then commits ``--rate`` OTPs a second for ``--seconds``, one app transaction each (a business
row and ``enqueue(type="otp")``, the post-commit nudge on, as an app has it), and waits until
every one is final:

- ``healthy``: both providers up: the baseline;
- ``503``: the primary down for the whole phase, every request answered 503 (the stub's
  ``down``), the backup healthy;
- ``refused``: the primary's address refuses every connection (the phase's worker is pointed
  at a port nobody listens on), the backup healthy.

An OTP's latency is its ``sent_at - created_at``: the worker's record of the accept (the
database's clock) less the ``enqueue`` (the app's clock; one host). Target, in each outage
phase: p99 <= failover_after + 5 s. Reported beside it: p50, p95 and max, the share sent
through the backup, the failovers by reason (``delivery_failovers_total``, the worker's and
beat's), and the load average (``/proc/loadavg``) before and after the phase.

    python -m bench.failover [--rate 20] [--seconds 30] [--pool threads:8]
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.orm import Session

from bench.common import (
    RUN_DIR,
    STUB_URL,
    Order,
    Processes,
    flush_redis,
    free_port,
    fresh_database,
    log,
    percentile,
    report,
    row,
    session,
    truncate,
    wait_until,
)
from delivery import enqueue, get_settings
from delivery.core.status import FINAL
from delivery.guards.breaker import Breakers

WARM_UP = 50
PHASES = ("healthy", "503", "refused")
OUTAGES = {"503": "every request answered 503", "refused": "every connection refused"}
BACKUP_PORT = free_port()
WORKER_METRICS = free_port()
BEAT_METRICS = free_port()


def config(path: Path, primary_url: str, failover_after: float) -> Path:
    path.write_text(f"""# written by bench/failover.py
[delivery]
# the product's defaults: leases, relay and sweeper intervals, batch size, breakers

[providers.primary]
kind = "http"
base_url = "{primary_url}"

[providers.backup]
kind = "http"
base_url = "http://127.0.0.1:{BACKUP_PORT}"

[channels.sms]
providers = ["primary", "backup"]
on_unknown = "retry"

[types.otp]                  # the example configuration's, and failover_after
channel = "sms"
max_attempts = 10
priority = "urgent"
ttl = 300.0
failover_after = {failover_after:g}

[types.otp.backoff]
base = 0.5
cap = 20.0
""")
    return path


FAILOVER_AFTER = 5.0  # issue 27's figure
CONFIG = config(RUN_DIR / "failover.toml", STUB_URL, FAILOVER_AFTER)
# The refused phase: the primary at an address where nothing listens (connection refused).
REFUSED_CONFIG = config(
    RUN_DIR / "failover-refused.toml", f"http://127.0.0.1:{free_port()}", FAILOVER_AFTER
)
# This process's settings (read on first use, and by delivery.worker when main imports it):
# enqueue(type="otp") and the post-commit nudge.
os.environ["DELIVERY_CONFIG"] = str(CONFIG)


def close_breakers() -> None:
    """Close both providers' shared breakers (and forget their failures)."""
    breakers = Breakers(get_settings())
    try:
        for name in ("primary", "backup"):
            breakers.get(name).reset()
    finally:
        breakers.close()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def steady(engine: Any, rate: float, count: int, prefix: str) -> None:
    """Commit ``count`` OTPs at ``rate``/s, one app transaction each."""
    interval = 1.0 / rate
    start = time.monotonic() + 0.1
    for i in range(count):
        pause = start + i * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        key = f"{prefix}-{i}"
        with Session(engine) as s, s.begin():
            s.add(Order(ref=key, amount=i))
            enqueue(
                s,
                type="otp",
                to=f"+1201555{i % 10000:04d}",
                payload={"body": f"Your code is {i % 1000000:06d}"},
                key=key,
            )


def final(engine: Any, prefix: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.scalar(
                text(
                    "SELECT count(*) FROM delivery_messages WHERE key LIKE :p AND status = ANY(:s)"
                ),
                {"p": f"{prefix}-%", "s": sorted(FINAL)},
            )
            or 0
        )


def failovers() -> Counter[str]:
    """``delivery_failovers_total`` by reason, as the worker and beat count it."""
    counted: Counter[str] = Counter()
    for port in (WORKER_METRICS, BEAT_METRICS):
        for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
            if line.startswith("delivery_failovers_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
                counted[labels["reason"]] += round(float(line.rsplit(" ", 1)[1]))
    return counted


def phase(
    engine: Any, procs: Processes, primary: Any, backup: Any, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One phase on a new worker and beat (the module docstring); its figures."""
    truncate(engine)
    flush_redis()
    primary.reset()
    backup.reset()
    pool, concurrency = args.pool.split(":")
    env = {
        "DELIVERY_CONFIG": str(REFUSED_CONFIG if name == "refused" else CONFIG),
        "DELIVERY_METRICS_PORT": str(WORKER_METRICS),
    }
    worker = procs.worker(pool=pool, concurrency=int(concurrency), name=f"failover-{name}", env=env)
    beat = procs.beat({**env, "DELIVERY_BEAT_METRICS_PORT": str(BEAT_METRICS)})
    count = round(args.rate * args.seconds)
    try:
        # Untimed, the phase's own way (the refused phase's worker fails its warm-up over),
        # then both breakers closed again: each phase starts from a closed breaker.
        steady(engine, args.rate, WARM_UP, f"warm-{name}")
        wait_until(lambda: final(engine, f"warm-{name}") >= WARM_UP, 120, 0.1, "warm-up")
        truncate(engine)
        primary.reset()
        backup.reset()
        close_breakers()
        if name == "503":
            primary.set_faults(down=True)
        before = failovers()
        load_before = loadavg()
        started = time.monotonic()
        steady(engine, args.rate, count, name)
        committed = time.monotonic() - started
        wait_until(lambda: final(engine, name) >= count, 600, 0.2, f"{count} OTPs final")
        load_after = loadavg()
        moved = failovers()
        moved.subtract(before)
    finally:
        procs.stop(beat)
        procs.stop(worker)
        primary.set_faults(down=False)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT status, provider, EXTRACT(EPOCH FROM sent_at - created_at) "
                "FROM delivery_messages WHERE key LIKE :p"
            ),
            {"p": f"{name}-%"},
        ).all()
    statuses = Counter(str(status) for status, _, _ in rows)
    latencies = [float(seconds) * 1000.0 for status, _, seconds in rows if status == "sent"]
    through = Counter(str(provider) for status, provider, _ in rows if status == "sent")
    effects = {"primary": primary.effects(), "backup": backup.effects()}
    keys = [f"{name}-{i}" for i in range(count)]
    both = [k for k in keys if k in effects["primary"] and k in effects["backup"]]
    result: dict[str, Any] = {
        "otps": count,
        "statuses": dict(statuses),
        "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
        "p95_ms": round(percentile(latencies, 95), 1) if latencies else None,
        "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "backup_share": round(through["backup"] / max(len(latencies), 1), 4),
        "through": dict(through),
        "failovers": {reason: n for reason, n in sorted(moved.items()) if n},
        "keys_at_both_providers": len(both),
        "commit_seconds": round(committed, 2),
        "loadavg": f"{load_before} -> {load_after}",
    }
    log(f"{name}: {result}")
    return result


def _figures(r: dict[str, Any]) -> str:
    return (
        f"p50 {r['p50_ms']:,.0f} ms, p95 {r['p95_ms']:,.0f} ms, p99 {r['p99_ms']:,.0f} ms, "
        f"max {r['max_ms']:,.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="OTPs committed per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="of commits, per phase")
    parser.add_argument("--pool", default="threads:8")
    args = parser.parse_args()
    import delivery.worker  # noqa: F401  (after DELIVERY_CONFIG is ours: installs the nudge here)

    bound_ms = (FAILOVER_AFTER + 5.0) * 1000.0
    results: dict[str, dict[str, Any]] = {}
    with session() as procs:
        engine = fresh_database()
        primary = procs.stub()
        backup = procs.stub(BACKUP_PORT, "backup")
        for name in PHASES:
            log(f"{name}: {round(args.rate * args.seconds)} OTPs at {args.rate:g}/s")
            results[name] = phase(engine, procs, primary, backup, name, args)
        healthy = results["healthy"]
        rows = []
        for name, what in OUTAGES.items():
            r = results[name]
            all_sent = r["statuses"] == {"sent": r["otps"]} and not r["keys_at_both_providers"]
            rows.append(
                row(
                    f"OTP commit -> accept p99 while the primary is down ({what}), "
                    f"{args.rate:g} OTPs/s for {args.seconds:g} s, failover_after = "
                    f"{FAILOVER_AFTER:g} s (ratio: to the same OTPs with it healthy)",
                    r["p99_ms"] / healthy["p99_ms"],
                    f"<= failover_after + 5 s ({bound_ms / 1000:g} s)",
                    r["p99_ms"] <= bound_ms and all_sent,
                    f"{_figures(r)}; {r['backup_share']:.1%} through the backup; failovers "
                    f"{r['failovers']}; {r['statuses']}, {r['keys_at_both_providers']} keys at "
                    f"both providers (load {r['loadavg']})",
                    f"primary healthy: {_figures(healthy)}; "
                    f"{healthy['backup_share']:.1%} through the backup (load {healthy['loadavg']})",
                )
            )
        figures = {
            "rate": args.rate,
            "seconds": args.seconds,
            "failover_after": FAILOVER_AFTER,
            "pool": args.pool,
            **results,
        }
        report("failover", figures, rows, engine)
        engine.dispose()


if __name__ == "__main__":
    main()
