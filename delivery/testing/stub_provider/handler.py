"""The stub's HTTP server: the provider API (``/v1/messages``) and the control API
(``/_stub/...``), over HTTP/1.1 with keep-alive."""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs

from delivery.testing.stub_provider.answers import (
    JSON,
    MAX_BODY,
    Answer,
    dumps,
    error,
    provider_error,
)
from delivery.testing.stub_provider.state import Logged, State, Stored

__all__ = ["Handler", "HttpServer"]


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, host: str, port: int, state: State) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.state = state
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__((host, port), Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that we do not need.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up mid-answer (a half-read response, a killed worker) is the
        client's doing: no traceback. Anything else is printed as ``socketserver`` does."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.connections_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # StreamRequestHandler sets TCP_NODELAY in setup()
    server_version = "stub-provider/1"
    sys_version = ""

    # --- plumbing -----------------------------------------------------------------------------

    @property
    def _srv(self) -> HttpServer:
        return cast(HttpServer, self.server)

    def setup(self) -> None:
        super().setup()
        with self._srv.connections_lock:
            self._srv.connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self._srv.connections_lock:
                self._srv.connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, answer: Answer) -> None:
        status, body, content_type, headers = answer
        reason = self.responses.get(status, ("Unknown",))[0]
        head = [
            f"HTTP/1.1 {status} {reason}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
        ]
        head += [f"{name}: {value}\r\n" for name, value in headers]
        if self.close_connection:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        self.wfile.write("".join(head).encode("latin-1") + body)

    def _read_body(self) -> bytes | None:
        """Return the request body, or None (and close) when it cannot be read."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            return b""
        try:
            length = int(length_header)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            return None
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes | None:
        parts: list[bytes] = []
        total = 0
        try:
            while True:
                size = int(self.rfile.readline(1024).split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > MAX_BODY:
                    raise ValueError("body too large")
                parts.append(self.rfile.read(size))
                self.rfile.readline(1024)
        except ValueError:
            self.close_connection = True
            return None

    def _route(self) -> None:
        """Every method's handler (``do_GET``, ``do_POST``, ...): ``self.command`` is the method."""
        method = self.command
        path, _, query = self.path.partition("?")
        if path == "/v1/messages":
            if method == "POST":
                self._post_message()
            elif method == "GET":
                self._send(self._lookup(query))
            else:
                self._send(error(405, "METHOD_NOT_ALLOWED"))
        elif path.startswith("/_stub/"):
            self._send(self._control(method, path))
        else:
            self._send(error(404, "NOT_FOUND"))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _route

    # --- provider API ---------------------------------------------------------------------------

    def _lookup(self, query: str) -> Answer:
        keys = parse_qs(query).get("idempotency_key")
        if not keys:
            return error(400, "INVALID_REQUEST", "idempotency_key query parameter is required")
        state = self._srv.state
        with state.lock:
            if state.faults["down"]:
                return provider_error(state.faults)
            body = state.lookup.get(keys[0])
        return error(404, "NOT_FOUND") if body is None else Answer(200, body, JSON)

    def _post_message(self) -> None:
        at = time.time()
        state = self._srv.state
        seq = state.next_seq()
        key = self.headers.get("Idempotency-Key") or ""
        authorization = self.headers.get("Authorization")
        auth = None if authorization is None else hashlib.sha256(authorization.encode()).hexdigest()
        raw = self._read_body()
        payload = _json(raw)
        to = payload.get("to") if isinstance(payload, dict) else None
        answer, outcome = self._answer(state, key, to, raw)
        state.record(seq, Logged(key, to, at, answer.status, outcome, auth))
        if outcome == "dropped":
            self.close_connection = True
        else:
            self._send(answer)

    def _answer(self, state: State, key: str, to: object, raw: bytes | None) -> tuple[Answer, str]:
        """The answer to one POST and what it was (``Logged.outcome``)."""
        with state.lock:
            if state.faults["down"]:
                return provider_error(state.faults), "error"
        if not isinstance(to, str) or not to:
            problem = "body must be a JSON object with 'to'" if raw is not None else None
            return error(400, "INVALID_REQUEST", problem or "unreadable request body"), "rejected"
        assert raw is not None
        digest = hashlib.sha256(raw).digest()
        claimed = False
        with state.lock:
            delay_ms: int = state.faults["delay_ms"]
            if key and state.faults["dedupe"]:
                stored = state.stored.get(key)
                if key in state.in_flight:
                    return error(409, "IDEMPOTENCY_IN_PROGRESS"), "rejected"
                if stored is not None and stored.digest == digest:
                    return Answer(stored.status, stored.body, stored.content_type), "replay"
                if stored is not None:
                    message = "Idempotency-Key was already used with a different request body"
                    return error(422, "IDEMPOTENCY_KEY_REUSED", message), "rejected"
                state.in_flight.add(key)
                claimed = True
        try:
            if delay_ms:
                time.sleep(delay_ms / 1000.0)
        except BaseException:
            if claimed:
                with state.lock:
                    state.in_flight.discard(key)
            raise
        # One critical section: the key goes from in flight to stored with no gap between.
        with state.lock:
            try:
                return self._process_locked(state, key, to, digest)
            finally:
                if claimed:
                    state.in_flight.discard(key)

    @staticmethod
    def _process_locked(state: State, key: str, to: str, digest: bytes) -> tuple[Answer, str]:
        faults = state.faults
        rule = state.rules.get(to)
        if rule is not None and not 200 <= rule.status < 300:
            return Answer(rule.status, rule.body, rule.content_type), "rejected"
        if rule is None:
            attempts = state.attempts.get(key, 0) + 1
            state.attempts[key] = attempts
            error_rate: float = faults["error_rate"]
            if attempts <= faults["fail_first"] or (error_rate and state.rng.random() < error_rate):
                return provider_error(faults), "error"
        msg_id = "msg_" + secrets.token_hex(12)
        message = dumps({"id": msg_id, "to": to, "status": "accepted"})
        if rule is None:
            answer = Answer(201, message, JSON)
        else:
            answer = Answer(rule.status, rule.body, rule.content_type)
        state.effects[key] = state.effects.get(key, 0) + 1
        if key:
            state.lookup[key] = message
            if faults["dedupe"]:
                state.stored[key] = Stored(digest, *answer[:3])
        state.queue_receipts_locked(msg_id, key, to)
        drop_rate: float = faults["drop_rate"]
        if (rule is not None and rule.drop) or (drop_rate and state.rng.random() < drop_rate):
            return answer, "dropped"
        return answer, "effect"

    # --- control API ----------------------------------------------------------------------------

    def _control(self, method: str, path: str) -> Answer:
        state = self._srv.state
        name = path[len("/_stub/") :]
        allowed = {
            "faults": ("GET", "PUT"),
            "receipts": ("GET", "PUT"),
            "reset": ("POST",),
            "effects": ("GET",),
            "requests": ("GET",),
            "health": ("GET",),
        }.get(name)
        if allowed is None:
            return error(404, "NOT_FOUND")
        if method not in allowed:
            return error(405, "METHOD_NOT_ALLOWED")
        if name == "faults":
            if method == "GET":
                return Answer(200, dumps(state.get_faults()), JSON)
            updates = _json(self._read_body())
            if not isinstance(updates, dict):
                return error(400, "INVALID_REQUEST", "body must be a JSON object")
            try:
                return Answer(200, dumps(state.set_faults(updates)), JSON)
            except ValueError as exc:
                return error(400, "INVALID_FAULT", str(exc))
        if name == "receipts":
            if method == "GET":
                return Answer(200, dumps(state.get_receipts()), JSON)
            updates = _json(self._read_body())
            if not isinstance(updates, dict):
                return error(400, "INVALID_REQUEST", "body must be a JSON object")
            try:
                return Answer(200, dumps(state.set_receipts(updates)), JSON)
            except ValueError as exc:
                return error(400, "INVALID_RECEIPTS", str(exc))
        if name == "reset":
            self._read_body()
            state.reset()
            return Answer(200, dumps({"ok": True}), JSON)
        if name == "effects":
            effects = state.get_effects()
            return Answer(200, dumps({"effects": effects, "total": sum(effects.values())}), JSON)
        if name == "requests":
            return Answer(200, dumps({"requests": state.get_requests()}), JSON)
        return Answer(200, dumps({"ok": True}), JSON)


def _json(raw: bytes | None) -> Any:
    """A request body's JSON value, or None when it is missing, empty or not JSON."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
