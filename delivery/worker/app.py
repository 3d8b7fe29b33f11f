"""The Celery application object, configured from ``delivery`` settings on first use.

Worker and beat refuse to start broken (``worker_init``, ``beat_init``): before either serves
anything it checks the provider secrets (worker) and the app's outcome hooks (``[delivery]
outcome_hooks``: each must import), that the outbox answers and is at this
package's schema revision (``delivery.runtime.db.check_outbox``, naming
``DELIVERY_DATABASE_URL`` and ``delivery db upgrade``) and that the broker answers (naming
``DELIVERY_BROKER_URL``), and otherwise exits with status 1 and one line on stderr
([docs/deployment.md](../../docs/deployment.md#start-up-checks)). Only the start is checked: an
outbox or broker that goes away later is retried and recovered from.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import (
    after_setup_logger,
    beat_init,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)
from kombu.entity import Queue

from delivery.errors import ConfigError
from delivery.observability import tracing
from delivery.providers.secrets import check_secrets
from delivery.runtime.current import get_settings
from delivery.runtime.db import check_outbox
from delivery.runtime.hooks import use_outcome_hooks
from delivery.runtime.service import Service
from delivery.worker import filebroker

__all__ = [
    "BULK",
    "QUEUE",
    "QUEUES",
    "QUIET_LOGGERS",
    "URGENT",
    "DeliveryCelery",
    "app",
    "check_broker",
    "quiet_http_loggers",
    "service",
]

log = logging.getLogger("delivery.worker")

QUEUE = "delivery"
URGENT = "delivery.urgent"
BULK = "delivery.bulk"
#: A message type's priority -> its queue. A worker serves them in this order (strictly on
#: Redis, where ``queue_order_strategy`` is ``priority``).
QUEUES = {"urgent": URGENT, "normal": QUEUE, "bulk": BULK}


def _queue(name: str) -> Queue:
    return Queue(name, routing_key=name)  # type: ignore[no-untyped-call]


class DeliveryCelery(Celery):  # type: ignore[misc]
    def on_configure(self) -> None:
        settings = get_settings()
        conf: dict[str, Any] = dict(
            broker_url=settings.broker_url,
            broker_connection_retry_on_startup=True,
            # Never wait forever for a pooled broker connection: a relay pass that could not
            # get one gives its rows back and the next pass tries again.
            broker_pool_acquire_timeout=5.0,
            task_default_queue=QUEUE,
            task_queues=[_queue(name) for name in QUEUES.values()],
            task_ignore_result=True,
            task_acks_late=True,
            task_reject_on_worker_lost=True,
            task_track_started=True,
            worker_prefetch_multiplier=4,
            worker_send_task_events=True,
            # Celery's default: a task-sent event is a second broker round trip inside the
            # app's commit() for every nudge (docs/deployment.md, "Celery settings").
            task_send_sent_event=False,
            result_extended=False,
        )
        if settings.broker_url.startswith("filesystem"):
            conf["broker_transport"] = filebroker.TRANSPORT
            conf["broker_transport_options"] = filebroker.options(Path(settings.home, "broker"))
        if settings.broker_url.startswith(("redis", "rediss")):
            conf["broker_transport_options"] = {
                "queue_order_strategy": "priority",
                # redis-py's default is no timeout at all: a half-open socket would hang a
                # publish (and with it the relay) for good.
                "socket_timeout": 10.0,
                "socket_connect_timeout": 5.0,
            }
        self.conf.update(conf)


_TASK_MODULES = ["deliver", "batch", "schedule", "leases"]
app = DeliveryCelery("delivery", include=[f"delivery.worker.{name}" for name in _TASK_MODULES])

_lock = threading.Lock()
_service: Service | None = None


def service() -> Service:
    """This process's ``Service`` (engine, provider clients), built on first use."""
    global _service
    with _lock:
        if _service is None:
            _service = Service.from_settings(get_settings())
        return _service


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_after_fork(**_: Any) -> None:
    """A forked child must not share its parent's database connections or sockets."""
    global _service
    with _lock:
        if _service is not None:
            _service.engine.dispose(close=False)
        _service = None


#: Loggers whose INFO lines carry request URLs (a webhook's URL is its recipient, a lookup's
#: query string names the key or the number): WARNING in worker and beat unless configured.
QUIET_LOGGERS = ("httpx", "httpcore")


@after_setup_logger.connect  # type: ignore[untyped-decorator]
def quiet_http_loggers(**_: Any) -> None:
    """httpx's ``HTTP Request: POST https://...`` lines stay out of the worker log (G6); a
    level you set on these loggers yourself is left as it is."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


#: How long a start-up check waits for the outbox or the broker to answer (seconds).
START_TIMEOUT = 5.0
BROKER_VARIABLE = "DELIVERY_BROKER_URL"


def check_broker(timeout: float = START_TIMEOUT) -> None:
    """Raise ``ConfigError`` (key ``DELIVERY_BROKER_URL``) unless one connection to the broker
    succeeds within about ``timeout`` seconds (no retries: the start-up retries of Celery come
    after this check, for a broker that goes away while the process runs)."""
    with app.connection_for_write() as conn:
        try:
            conn.ensure_connection(max_retries=1, timeout=timeout)
        except Exception as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise ConfigError(
                BROKER_VARIABLE, f"cannot connect to {conn.as_uri()}: {reason}"
            ) from None


def _refuse(process: str, exc: ConfigError) -> None:
    """End this process with one line on stderr naming the setting, and status 1."""
    raise SystemExit(f"delivery {process} not started: {exc}")


@worker_init.connect  # type: ignore[untyped-decorator]
def _check_worker(**_: Any) -> None:
    """A worker does not start without every provider's secrets (a missing one would kill
    every message at send time; the dotted key and variable name, never a value), the app's
    outcome hooks (``[delivery] outcome_hooks``, registered here, before the pool forks), an
    outbox at this package's schema revision, or a broker that answers."""
    try:
        settings = get_settings()
        check_secrets(settings)
        use_outcome_hooks(settings)
        check_outbox(settings.database_url, timeout=START_TIMEOUT)
        check_broker()
    except ConfigError as exc:
        _refuse("worker", exc)
    tracing.configure("delivery-worker")  # when OTEL_* asks for traces; before the pool forks


@worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _flush_spans(**_: Any) -> None:
    """A pool process's last spans are exported before it exits."""
    tracing.flush()


@beat_init.connect  # type: ignore[untyped-decorator]
def _check_beat(**_: Any) -> None:
    """Beat does not start its relay and sweeper (``delivery.worker.schedule``, whose own
    ``beat_init`` receiver is connected after this one) without the app's outcome hooks (the
    sweeper applies receipts), an outbox at this package's schema revision and a broker that
    answers."""
    try:
        settings = get_settings()
        use_outcome_hooks(settings)
        check_outbox(settings.database_url, timeout=START_TIMEOUT)
        check_broker()
    except ConfigError as exc:
        _refuse("beat", exc)
    tracing.configure("delivery-beat")
