"""``delivery receiver``: serve the receipt receiver (``delivery.receipts``) with Granian, a
production server (HTTP in Rust, the WSGI app in a pool of Python threads per process); it
refuses to start broken (exit 2, one line naming the setting)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from typing import TYPE_CHECKING

import click

from delivery.cli.common import binding, host_port_options, require_extra
from delivery.config.loading import load_settings
from delivery.observability import tracing
from delivery.runtime.hooks import use_outcome_hooks

if TYPE_CHECKING:
    from delivery.receipts import Receiver

__all__ = ["PROCESSES", "THREADS", "receiver_command", "serving"]

PROCESSES = min(os.cpu_count() or 1, 4)
"""The default number of processes: one per core, up to four (each has its own pool of
database connections)."""
THREADS = 128
"""The default number of threads per process, each answering one request: the receipts in
flight at once. They mostly wait for their batch's commit, so more threads make bigger
batches, not more work: with 32 (two processes, 64 in flight) the receiver stored about 5,500
receipts/s on 2 cores however many connections called, with 128 about 7,300-7,900 on 128-256
connections (2026-12-06, ``bench.receipts``'s load)."""


@click.command("receiver")
@host_port_options(8026)
@click.option(
    "--processes",
    type=click.IntRange(1, 64),
    default=PROCESSES,
    show_default="one per core, up to 4",
    help="Processes serving the app, each with its own writer and database pool.",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 256),
    default=THREADS,
    show_default=True,
    help="Threads per process that run the app: receipts in flight at once, stored together.",
)
def receiver_command(host: str, port: int, processes: int, threads: int) -> None:
    """Receive providers' delivery receipts: POST /receipts/PROVIDER.

    Serves every provider whose [providers.NAME] sets receipt_secret_env (kind http) or
    status_callback_url (kind twilio), on the outbox of the same DELIVERY_* settings as every
    command. Each receipt is stored before it is answered.
    """
    require_extra("receiver")
    from granian import Granian
    from granian.constants import Interfaces

    # Several processes count in files that GET /metrics sums; the variable must be set
    # before prometheus_client is first imported (by ``serving`` below, or an app's hooks).
    own_metrics_dir = None
    if processes > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        own_metrics_dir = tempfile.mkdtemp(prefix="delivery-receiver-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = own_metrics_dir
    try:
        checked = serving()  # refuses to start broken, before anything listens
        names = ", ".join(sorted(checked.checks))
        checked.engine.dispose()  # each worker process builds its own (``serving``)
        with binding(host, port), socket.create_server((host, port)) as probe:
            port = probe.getsockname()[1]  # free; 0 -> one the system chose
        server = Granian(
            f"{__name__}:serving",
            factory=True,
            address=host,
            port=port,
            interface=Interfaces.WSGI,
            workers=processes,
            blocking_threads=threads,
            websockets=False,
        )
        logging.getLogger("_granian").addFilter(_threads_warning)  # Granian's own logger
        line = f"delivery receiver on http://{host}:{port}/receipts/ ({names}); Ctrl-C stops it"
        server.on_startup(lambda: click.echo(line, err=True))  # listening: requests wait
        server.serve()
    finally:
        if own_metrics_dir is not None:
            shutil.rmtree(own_metrics_dir, ignore_errors=True)


def _threads_warning(record: logging.LogRecord) -> bool:
    """Granian warns when a WSGI worker may run more threads than 2 x cores + 1, as threads
    that compete for the CPU would. The receiver's mostly wait for their batch's commit, and
    their number is what lets a batch grow (``--threads``): drop that warning, keep the rest."""
    return "Python threads, which seems quite high" not in record.getMessage()


def serving() -> Receiver:
    """The receiver of this process's settings, the app's outcome hooks registered (its
    receipts move messages to ``delivered`` and ``undelivered``): what each Granian worker
    serves, and what the command checks before it starts."""
    from delivery.receipts import make_receiver

    settings = load_settings(publishes=False)  # needs no broker (nor its password)
    use_outcome_hooks(settings)
    tracing.configure("delivery-receiver")  # when OTEL_* asks for traces
    return make_receiver(settings)
