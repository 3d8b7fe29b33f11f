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
    from celery.bin.celery import main as celery_main

    app, *options = argv
    sys.argv = ["celery", "-A", app, "worker", *options]
    celery_main()


if __name__ == "__main__":
    main(sys.argv[1:])
