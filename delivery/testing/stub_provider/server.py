"""``StubServer``: the stub in this process; ``main``: the stub in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from delivery.testing.stub_provider.handler import HttpServer
from delivery.testing.stub_provider.state import State

__all__ = ["StubServer", "main"]


class StubServer:
    """The stub provider, bound at construction; ``start()`` serves it from a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._state = State()
        self._httpd = HttpServer(host, port, self._state)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._serving = False
        self._closed = False

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._httpd.server_address[0])
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def start(self) -> StubServer:
        """Serve from a daemon thread (idempotent) and return self."""
        with self._lock:
            if self._closed:
                raise RuntimeError("stub server is stopped")
            if self._thread is None:
                thread = threading.Thread(
                    target=self._serve, name=f"stub-provider:{self.port}", daemon=True
                )
                self._serving = True
                try:
                    thread.start()
                except BaseException:  # interrupted (Ctrl-C): nothing serves, nothing to join
                    self._serving = False
                    raise
                self._thread = thread  # only a started thread is ever joined
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until ``stop()`` is called from another thread."""
        with self._lock:
            if self._closed or self._serving:
                raise RuntimeError("stub server is stopped or already serving")
            self._serving = True
        self._serve()

    def _serve(self) -> None:
        try:
            self._httpd.serve_forever(poll_interval=0.05)
        finally:
            with self._lock:
                self._serving = False

    def stop(self) -> None:
        """Stop serving, drop open connections, release the port and stop the receipts'
        sender thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            serving = self._serving
        if serving:
            self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        self._state.close()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=5)

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Merge ``faults`` into the current faults and return them all; ValueError if bad."""
        return self._state.set_faults(faults)

    def faults(self) -> dict[str, Any]:
        return self._state.get_faults()

    def reset(self) -> None:
        """Restore default faults and receipts' config; forget effects, stored messages, the
        request log, the receipts' log and the receipts not yet sent."""
        self._state.reset()

    def set_receipts(self, **knobs: Any) -> dict[str, Any]:
        """Merge ``knobs`` into the receipts' config and return it; ValueError if bad."""
        return self._state.set_receipts(knobs)

    def receipts(self) -> dict[str, Any]:
        """``{"config": {...}, "sent": [...]}``, as ``GET /_stub/receipts`` answers."""
        return self._state.get_receipts()

    def effects(self) -> dict[str, int]:
        return self._state.get_effects()

    def requests(self) -> list[dict[str, Any]]:
        return self._state.get_requests()


def main(argv: list[str] | None = None) -> None:
    """Run the stub in the foreground until SIGINT or SIGTERM. A port it cannot bind (taken by
    another process, or not allowed) ends it with one line naming the port, and status 2."""
    parser = argparse.ArgumentParser(
        prog="python -m delivery.testing.stub_provider",
        description="Fault-injecting stub of the reference message provider.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument(
        "--port", type=int, default=9090, help="port to bind, 0 for any (default %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        stub = StubServer(args.host, args.port)
    except OSError as exc:
        print(
            f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc} "
            f"(does another process have port {args.port}? choose another with --port)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    in_main_thread = threading.current_thread() is threading.main_thread()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in signals}
    stopping: list[threading.Thread] = []
    starting: list[bool] = []

    def request_stop(signum: int, frame: FrameType | None) -> None:
        # Stop from a thread of its own: serve_forever then returns between two polls, and no
        # exception is raised at whatever line the main thread was on (which could leave a
        # lock held and the process hanging).
        # A second signal (Ctrl-C's SIGINT, then a script's SIGTERM) may run inside this
        # handler: ``starting`` is claimed first, so the nested call does nothing, and a
        # thread is recorded only once started, so the finally below joins only those.
        if not starting:
            starting.append(True)
            thread = threading.Thread(target=stub.stop, name="stub-provider-stop")
            thread.start()
            stopping.append(thread)

    if in_main_thread:
        for signum in signals:  # also when SIGINT was ignored (e.g. started with `&`)
            signal.signal(signum, request_stop)
    print(f"stub provider listening on {stub.url}", flush=True)
    try:
        stub.serve_forever()
    except RuntimeError:
        if not starting:  # stopped by a signal before it began serving: a clean exit
            raise
    except KeyboardInterrupt:  # not the main thread, or a handler of the caller's
        pass
    finally:
        for thread in stopping:
            thread.join(10)
        stub.stop()
        if in_main_thread:
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)
