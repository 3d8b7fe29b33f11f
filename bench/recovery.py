"""Recovery after a worker is killed (issue 12 §2), with the default settings, next to the
code before the change in the same run; prints the rows for ``bench/RELIABILITY.md``.

    python -m bench.recovery [--n 150] [--baseline /tmp/recovery-baseline] [--brokers redis]

Runs ``tests/recovery.py``'s ``held_by_killed_worker`` on a private cluster: one worker
(4 threads, prefetching 16) against a provider answering in 0.5 s, SIGKILLed while it holds
messages, a new worker 0.5 s later; the figure is the time from the kill until the last
message is sent. ``--baseline`` names a checkout of an older tree (``git archive
946b8ff | tar -x -C DIR``): its worker and beat run the same scenario from that tree, in the
same run, on the same cluster, with that tree's default leases and sweep interval. Then
``killed_right_after_receipt`` (a worker that stops itself on its first receipt, before its
keeper renews, SIGKILLed 2 s later) for each tree and broker, in a second table. The load
average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import chaos_cluster, recovery  # noqa: E402
from tests.chaos_cluster import ChaosConfig, Cluster  # noqa: E402


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def _defaults_of(tree: Path) -> ChaosConfig:
    """``recovery.DEFAULTS`` with the leases and sweep interval ``tree``'s settings default to."""
    source = (tree / "delivery" / "config" / "settings.py").read_text()
    found = {
        name: float(match.group(1))
        for name in ("dispatch_lease", "sweep_interval", "relay_interval", "send_lease")
        if (match := re.search(rf"^    {name}: float = ([0-9.]+)", source, re.M))
    }
    return dataclasses.replace(_OURS, **found)


_OURS = recovery.DEFAULTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--brokers", default="redis,rabbitmq")
    args = parser.parse_args(argv)
    rows: list[str] = []
    receipts: list[str] = []
    with Cluster() as cluster:
        runs: list[tuple[str, str, Path]] = []
        if args.baseline is not None:
            runs.append(("before", "redis", args.baseline))
        runs += [("after", broker, ROOT) for broker in args.brokers.split(",")]
        for label, broker, tree in runs:
            if broker == "rabbitmq" and not Cluster.rabbitmq_reachable():
                continue
            chaos_cluster.ROOT = tree  # the worker and beat run from this tree
            recovery.DEFAULTS = _defaults_of(tree)  # and with that tree's default settings
            os.environ["PYTHONPATH"] = str(tree)
            before = _loadavg()
            started = time.monotonic()
            report = recovery.held_by_killed_worker(cluster, args.n, broker)
            figures = report.figures
            rows.append(
                f"| {label} | {broker} | {args.n} | {figures.get('open_at_kill')} | "
                f"{figures.get('held_at_kill')} | {figures.get('last_held_sent_after_kill_s')} | "
                f"{report.recovery_s} | {report.duplicates} | {report.lost} | "
                f"{round(time.monotonic() - started)} | {before} -> {_loadavg()} |"
            )
            print(report.summary(), file=sys.stderr, flush=True)
            before = _loadavg()
            receipt = recovery.killed_right_after_receipt(cluster, 6, broker)
            receipts.append(
                f"| {label} | {broker} | {receipt.figures.get('dispatched_at_kill')} | "
                f"{receipt.recovery_s} | {receipt.duplicates} | {receipt.lost} | "
                f"{before} -> {_loadavg()} |"
            )
            print(receipt.summary(), file=sys.stderr, flush=True)
    print(
        "| code | broker | messages | open at kill | held at kill | last held one sent after "
        "kill (s) | last open one sent after kill (s) | duplicate effects | lost | wall (s) | "
        "load average (before -> after) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    print()
    print(
        "| code | broker | dispatched at kill | last sent after kill (s) | duplicate effects | "
        "lost | load average (before -> after) |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    print("\n".join(receipts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
