"""Celery alone: what an app writes without an outbox, the baseline of the benchmarks.

The app calls ``send.apply_async`` right after its own commit (recipient and body travel in
the broker); the task POSTs to the provider with httpx, with an ``Idempotency-Key``, and
retries 5xx and 429. Run it with ``celery -A bench.celery_alone worker``.

Plain Celery settings (acks on receipt, no events). ``BENCH_ALONE_MATCHED=1`` switches on
the operational settings ``delivery.worker.app`` uses (late acks, task events, sent events, track
started), to tell the cost of those settings apart from the cost of the outbox;
``BENCH_ALONE_WIRE=1`` sends through ``delivery``'s HTTP transport (``Wire``) instead of httpx's.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import httpx
from celery import Celery, Task
from celery.signals import worker_process_init

__all__ = ["QUEUE", "app", "send"]

QUEUE = "celery_alone"


class _AloneCelery(Celery):  # type: ignore[misc]
    def on_configure(self) -> None:
        """Read the environment when Celery first needs its settings, not at import: the
        benchmark sets ``DELIVERY_BROKER_URL`` (its own Redis db) before it publishes."""
        self.conf.update(
            broker_url=os.environ["DELIVERY_BROKER_URL"],
            task_default_queue=QUEUE,
            task_ignore_result=True,
            worker_prefetch_multiplier=4,
            broker_connection_retry_on_startup=True,
        )
        if os.environ.get("BENCH_ALONE_MATCHED") == "1":
            self.conf.update(
                task_acks_late=True,
                task_reject_on_worker_lost=True,
                task_track_started=True,
                worker_send_task_events=True,
                task_send_sent_event=True,
            )


app = _AloneCelery("celery_alone")

_lock = threading.Lock()
_client: httpx.Client | None = None


def client() -> httpx.Client:
    """One pooled client per process, like ``delivery``'s provider client."""
    global _client
    with _lock:
        if _client is None:
            _client = httpx.Client(
                base_url=os.environ.get("BENCH_STUB_URL", "http://127.0.0.1:9090"),
                headers={"User-Agent": "celery-alone/0.1"},
                timeout=httpx.Timeout(connect=3.0, read=10.0, write=5.0, pool=5.0),
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            )
        return _client


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_after_fork(**_: Any) -> None:
    global _client
    _client = None


@app.task(name="bench.send", bind=True, max_retries=8)  # type: ignore[untyped-decorator]
def send(self: Task, order_id: int, to: str, payload: dict[str, Any], key: str) -> str:
    """POST one message; retry 5xx and 429 with the same key."""
    response = client().post(
        "/v1/messages", json={"to": to, **payload}, headers={"Idempotency-Key": key}
    )
    if response.status_code >= 500 or response.status_code == 429:
        raise self.retry(countdown=1)
    response.raise_for_status()
    return str(response.json()["id"])
