"""``serve``: the console on Werkzeug's threaded WSGI server, until SIGINT or SIGTERM."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

from flask import Flask
from werkzeug.serving import BaseWSGIServer, make_server

__all__ = ["make_console_server", "serve"]


def make_console_server(app: Flask, host: str, port: int) -> BaseWSGIServer:
    """A threaded server for ``app`` bound to ``host:port`` (port 0: any free one)."""
    return make_server(host, port, app, threaded=True)


def serve(app: Flask, host: str, port: int, *, ready: Callable[[str], None]) -> None:
    """Serve until SIGINT or SIGTERM; ``ready`` gets the URL once the socket is bound."""
    server = make_console_server(app, host, port)
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    ready(f"http://{host}:{server.server_port}")
    try:
        server.serve_forever()
    finally:
        server.server_close()
