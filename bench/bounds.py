"""Bounded answers (G7): what a hostile or broken provider costs one attempt, before and after.

Serves four answers from a local HTTP server on a free port and sends to each with the
reference adapter (``HttpProvider``: the answer streamed, kept up to 64 KiB, the exchange
under its deadline) and, as the baseline in the same run, with what the adapter did before
(``httpx.Client.post``, the whole body read, then ``classify_response``):

- ``huge``: a 50 MB error body;
- ``bomb``: a gzip body of 256 KB that inflates to 256 MiB;
- ``drip``: headers at once, then one body byte every 0.5 s for 15 s (each read well within
  the read timeout);
- ``ok``: the happy path, 201 with an id, to show what streaming costs (sends per second,
  median of alternating rounds).

Timeouts of both: connect 1, write 1, read 2, pool 1 (the deadline is their sum, 5 s).
Memory is the peak of Python allocations (tracemalloc) during the call.

    python -m bench.bounds                 # prints the table
    python -m bench.bounds --write         # and puts it into bench/RELIABILITY.md
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.server
import re
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core.outcomes import classify_exception, classify_response
from delivery.providers.base import Envelope
from delivery.providers.http import HttpProvider

OUT = Path(__file__).resolve().parent / "RELIABILITY.md"
BEGIN, END = "<!-- bench.bounds -->", "<!-- /bench.bounds -->"
TIMEOUTS = Timeouts(connect=1.0, write=1.0, read=2.0, pool=1.0)
HUGE = 50 * 1024 * 1024
BOMB = gzip.compress(b"\0" * (256 * 1024 * 1024), compresslevel=9)
DRIP_BYTES, DRIP_EVERY = 30, 0.5
OK_SENDS = 2000
ROUNDS = 10


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/huge/v1/messages":
            self._head(500, HUGE)
            chunk = b"x" * 65536
            try:
                for _ in range(HUGE // len(chunk)):
                    self.wfile.write(chunk)
            except OSError:
                pass
        elif self.path == "/bomb/v1/messages":
            self._head(400, len(BOMB), ("Content-Encoding", "gzip"))
            with contextlib.suppress(OSError):
                self.wfile.write(BOMB)
        elif self.path == "/drip/v1/messages":
            self._head(201, DRIP_BYTES)
            try:
                for _ in range(DRIP_BYTES):
                    time.sleep(DRIP_EVERY)
                    self.wfile.write(b" ")
                    self.wfile.flush()
            except OSError:
                pass
        else:
            body = b'{"id": "msg_1"}'
            self._head(201, len(body))
            self.wfile.write(body)

    def _head(self, status: int, length: int, *extra: tuple[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that stop reading (the bounded adapter) reset their connection


def _baseline(base: str) -> Callable[[Envelope], Any]:
    """The adapter's send as it was: ``Client.post`` reads the whole body."""
    client = httpx.Client(
        base_url=base,
        timeout=httpx.Timeout(connect=1.0, read=2.0, write=1.0, pool=1.0),
    )

    def send(envelope: Envelope) -> Any:
        try:
            response = client.post(
                "/v1/messages",
                json={"to": envelope.to, **envelope.payload},
                headers={"Idempotency-Key": envelope.key},
            )
        except httpx.HTTPError as exc:
            return classify_exception(exc)
        return classify_response(response)

    return send


def _bounded(base: str) -> Callable[[Envelope], Any]:
    return HttpProvider(ProviderConfig("p", "http", base, TIMEOUTS)).send


def _measure(send: Callable[[Envelope], Any]) -> tuple[float, float, str]:
    """Seconds, peak MiB allocated, and the outcome of one send."""
    envelope = Envelope("bench-1", "sms", "+12015550123", {"body": "hi"})
    tracemalloc.start()
    started = time.perf_counter()
    outcome = send(envelope)
    took = time.perf_counter() - started
    _size, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    code = getattr(outcome, "code", None) or getattr(outcome, "provider_ref", "")
    return took, peak / 2**20, f"{type(outcome).__name__} {code}"


def _rates(old: Callable[[Envelope], Any], new: Callable[[Envelope], Any]) -> tuple[float, float]:
    """Median sends/s of each over ``ROUNDS`` alternating rounds (the load is shared)."""
    envelope = Envelope("bench-1", "sms", "+12015550123", {"body": "hi"})
    got: dict[int, list[float]] = {0: [], 1: []}
    old(envelope), new(envelope)
    for _ in range(ROUNDS):
        for which, send in enumerate((old, new)):
            started = time.perf_counter()
            for _ in range(OK_SENDS // ROUNDS):
                send(envelope)
            got[which].append(OK_SENDS // ROUNDS / (time.perf_counter() - started))
    return statistics.median(got[0]), statistics.median(got[1])


def run() -> list[str]:
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    rows = []
    try:
        for case, what in (
            ("huge", "500 with a 50 MB body"),
            ("bomb", "400, gzip: 256 KB inflating to 256 MiB"),
            (
                "drip",
                f"201, body dripping 1 byte / {DRIP_EVERY} s for {DRIP_BYTES * DRIP_EVERY:g} s",
            ),
        ):
            base = f"http://127.0.0.1:{port}/{case}"
            old = _measure(_baseline(base))
            new = _measure(_bounded(base))
            rows.append(
                f"| {what} | {old[0]:.2f} s, {old[1]:.1f} MiB, {old[2]} "
                f"| {new[0]:.2f} s, {new[1]:.2f} MiB, {new[2]} |"
            )
        base = f"http://127.0.0.1:{port}/ok"
        old_rate, new_rate = _rates(_baseline(base), _bounded(base))
        rows.append(
            f"| 201 with an id (happy path): median of {ROUNDS} alternating rounds of "
            f"{OK_SENDS // ROUNDS} sends "
            f"| {old_rate:.0f} sends/s | {new_rate:.0f} sends/s |"
        )
    finally:
        server.shutdown()
        server.server_close()
    return rows


def section(rows: list[str]) -> str:
    load = Path("/proc/loadavg").read_text().split()[:3]
    return "\n".join(
        [
            BEGIN,
            "## Bounded answers (G7)",
            "",
            f"_Written by `python -m bench.bounds --write` on "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
            f"{', '.join(load)} (2 CPUs, shared)._ One attempt of the reference adapter "
            "against a local server; the baseline, in the same run, is the adapter as it was "
            "(`httpx.Client.post` reads the whole body). Timeouts: connect 1, write 1, read 2, "
            "pool 1 s, so the attempt's deadline is 5 s. Memory: peak Python allocations "
            "during the call (tracemalloc).",
            "",
            "| answer | before: time, memory, outcome | after: time, memory, outcome |",
            "|---|---|---|",
            *rows,
            "",
            "Also proven by tests, not timed: a 300-character error code and "
            "`Retry-After: 999999999999` no longer leave a row in `sending` "
            "(`tests/test_security.py::test_the_reported_answers_do_not_leave_a_message_in_"
            "sending`); any status, headers and body give a closed outcome that PostgreSQL "
            "stores, for each adapter (`tests/test_bounds_adapters.py`); provider text naming "
            "the recipient reaches no log, Flower page, broker message or CLI output "
            "(`tests/test_security.py::test_provider_errors_naming_the_recipient_leave_no_trace`).",
            END,
        ]
    )


def write(text: str, path: Path = OUT) -> None:
    """Replace this bench's section of RELIABILITY.md (or append it)."""
    doc = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    doc = pattern.sub(lambda _m: text, doc) if pattern.search(doc) else doc.rstrip() + "\n\n" + text
    path.write_text(doc.rstrip() + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bounds", description=__doc__)
    parser.add_argument("--write", action="store_true", help="update bench/RELIABILITY.md")
    args = parser.parse_args(argv)
    text = section(run())
    print(text)
    if args.write:
        write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
