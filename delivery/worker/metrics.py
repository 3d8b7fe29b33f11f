"""Worker metrics: the transition and breaker hooks feed ``WorkerMetrics``
(``delivery.observability.metrics``).

Importing ``delivery.worker`` registers the hooks in every process (they only count). A worker
serves ``/metrics`` when ``DELIVERY_METRICS_PORT`` is set (address ``DELIVERY_METRICS_ADDR``,
default ``127.0.0.1``), read when the worker starts:

- threads or solo pool: the worker's own registry;
- prefork: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty folder writable by the worker, the
  same for the parent and its children; the parent serves the sum of every child's files,
  and a child's files are marked dead when it exits. Wipe the folder when the worker
  (re)starts, e.g. in the container's entrypoint.

The relay runs in beat (``delivery.worker.schedule``) and observes its batch sizes there; beat
serves its own ``/metrics`` (relay batch sizes, the sweeper's transitions) when
``DELIVERY_BEAT_METRICS_PORT`` is set (same address variable).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.signals import beat_init, worker_init, worker_process_shutdown
from prometheus_client import CollectorRegistry, multiprocess, start_http_server

from delivery.guards.breaker import add_breaker_hook
from delivery.observability.events import add_hook
from delivery.observability.metrics import WorkerMetrics, served_registry

__all__ = ["metrics", "registry"]

log = logging.getLogger("delivery.worker.metrics")

registry = CollectorRegistry()
"""This process's worker metrics (served as is unless ``PROMETHEUS_MULTIPROC_DIR`` is set)."""

metrics = WorkerMetrics(registry)
add_hook(metrics.observe_transition)
add_breaker_hook(metrics.observe_breaker)


@worker_init.connect  # type: ignore[untyped-decorator]
def _serve(**_: Any) -> None:
    """Serve /metrics from the worker's main process when DELIVERY_METRICS_PORT is set."""
    port = os.environ.get("DELIVERY_METRICS_PORT")
    if not port:
        return
    addr = os.environ.get("DELIVERY_METRICS_ADDR", "127.0.0.1")
    served = served_registry(registry)
    start_http_server(int(port), addr=addr, registry=served)
    log.info("serving worker metrics on http://%s:%s/metrics", addr, port)


@beat_init.connect  # type: ignore[untyped-decorator]
def _serve_beat(**_: Any) -> None:
    """Serve beat's /metrics when DELIVERY_BEAT_METRICS_PORT is set."""
    port = os.environ.get("DELIVERY_BEAT_METRICS_PORT")
    if port:
        addr = os.environ.get("DELIVERY_METRICS_ADDR", "127.0.0.1")
        start_http_server(int(port), addr=addr, registry=registry)
        log.info("serving beat metrics on http://%s:%s/metrics", addr, port)


@worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _child_exits(pid: int | None = None, **_: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]
