"""Recovery after a worker is killed (issue 12 §2), with the default settings, next to the
code before the change in the same run; prints the rows for ``bench/RELIABILITY.md``.

    python -m bench.recovery [--n 150] [--baseline /tmp/recovery-baseline]

Runs ``tests/recovery.py``'s ``held_by_killed_worker`` on a private cluster: one worker
(4 threads, prefetching 16) against a provider answering in 0.5 s, SIGKILLed while it holds
messages, a new worker 0.5 s later; the figure is the time from the kill until the last
message is sent. ``--baseline`` names a checkout of the previous commit (``git archive
011603c | tar -x -C DIR``): its worker and beat run the same scenario from that tree, in the
same run, on the same cluster. The load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import chaos_cluster, recovery  # noqa: E402
from tests.chaos_cluster import Cluster  # noqa: E402


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    with Cluster() as cluster:
        runs: list[tuple[str, str, Path]] = []
        if args.baseline is not None:
            runs.append(("before (011603c)", "redis", args.baseline))
        runs += [("after", "redis", ROOT), ("after", "rabbitmq", ROOT)]
        for label, broker, tree in runs:
            if broker == "rabbitmq" and not Cluster.rabbitmq_reachable():
                continue
            chaos_cluster.ROOT = tree  # the worker and beat run from this tree
            os.environ["PYTHONPATH"] = str(tree)
            before = _loadavg()
            started = time.monotonic()
            report = recovery.held_by_killed_worker(cluster, args.n, broker)
            figures = report.figures
            rows.append(
                f"| {label} | {broker} | {args.n} | {figures.get('held_at_kill')} | "
                f"{report.recovery_s} | {report.duplicates} | {report.lost} | "
                f"{round(time.monotonic() - started)} | {before} -> {_loadavg()} |"
            )
            print(report.summary(), file=sys.stderr, flush=True)
    print(
        "| code | broker | messages | held at kill | last sent after kill (s) | duplicate "
        "effects | lost | wall (s) | load average (before -> after) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
