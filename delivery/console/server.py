"""``serve``: the console on Werkzeug's threaded WSGI server, until SIGINT or SIGTERM."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

from flask import Flask
from werkzeug.serving import BaseWSGIServer, make_server, select_address_family

__all__ = ["make_console_server", "serve"]


def make_console_server(app: Flask, host: str, port: int) -> BaseWSGIServer:
    """A threaded server for ``app`` bound to ``host:port`` (port 0: any free one). The socket
    is bound here, so a port in use raises ``OSError`` (Werkzeug's own bind prints two lines and
    exits instead); the server gets it through ``make_server``'s ``fd``."""
    family = select_address_family(host, port)
    with socket.create_server((host, port), family=family) as bound:
        return make_server(host, port, app, threaded=True, fd=bound.fileno())


def serve(server: BaseWSGIServer, *, ready: Callable[[str], None]) -> None:
    """Serve ``server`` (``make_console_server``) until SIGINT or SIGTERM; ``ready`` gets its
    URL first."""
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    ready(f"http://{server.host}:{server.port}")
    try:
        server.serve_forever()
    finally:
        server.server_close()
