"""``python -m bench.run_worker APP [celery worker options]``: a celery worker for ``APP`` that
prints ``bench-worker-ready`` when it consumes, so benchmarks can log at WARNING."""

from __future__ import annotations

import sys
from typing import Any

from celery.signals import worker_ready


@worker_ready.connect  # type: ignore[untyped-decorator]
def _ready(**_: Any) -> None:
    print("bench-worker-ready", flush=True)


def main(argv: list[str]) -> None:
    import os

    from celery.bin.celery import main as celery_main

    app, *options = argv
    if os.environ.get("BENCH_NO_EVENTS") == "1":  # to measure what task events cost
        import importlib

        module = importlib.import_module(app)
        module.app.conf.update(worker_send_task_events=False, task_track_started=False)
    sys.argv = ["celery", "-A", app, "worker", *options]
    celery_main()


if __name__ == "__main__":
    main(sys.argv[1:])
