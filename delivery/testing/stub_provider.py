"""A fault-injecting stub of the reference message provider, for tests and benchmarks.

Protocol (JSON over HTTP/1.1, keep-alive):

* ``POST /v1/messages`` with body ``{"to": "<non-empty string>", ...payload}`` and an optional
  ``Idempotency-Key`` header. Success is ``201 {"id": "msg_<hex>", "to": ..., "status":
  "accepted"}`` and records one *effect* under the key (``""`` when the header is absent or
  empty). A bad JSON body or a missing ``to`` gives ``400 {"code": "INVALID_REQUEST"}``.
* Dedupe (on by default, keyed requests only): the same key with the same body (sha256 of the
  raw bytes) replays the stored status and body byte for byte with no new effect; the same key
  with another body gives ``422 {"code": "IDEMPOTENCY_KEY_REUSED"}``; the same key while its
  first request is still in flight gives ``409 {"code": "IDEMPOTENCY_IN_PROGRESS"}``. Only
  answers that recorded an effect are stored, so a key that got an injected error can be retried.
* ``GET /v1/messages?idempotency_key=K`` returns ``200`` with the stored message (the 201
  shape) or ``404 {"code": "NOT_FOUND"}``. Lookup works whether or not dedupe is on.

Fault knobs (all off by default; ``PUT /_stub/faults`` merges a partial dict, top level only):

* ``drop_rate`` (0..1): record the effect and store the message, then close the connection
  without answering. Draws come from ``random.Random(seed)``; ``seed`` reseeds when set.
* ``delay_ms``: sleep after the dedupe check and before processing; the key is in flight.
* ``error_rate`` (0..1) and ``error_status`` (default 503): answer an error with no effect.
  A 503 with ``error_html`` (default true) is an HTML page; a 429 is ``{"code":
  "RATE_LIMITED"}``; anything else is ``{"code": "PROVIDER_ERROR"}``. ``retry_after``
  (seconds or null) adds a ``Retry-After`` header to these errors.
* ``fail_first``: the first N POSTs per key get the ``error_status`` answer, whatever
  ``error_rate`` says.
* ``rules``: ``{recipient: {"status": int, "json": value}}`` or ``{recipient: {"status": int,
  "body": "text", "content_type": "..."}}``. Such a recipient always gets that answer, before
  any other fault; a non-2xx rule records no effect, a 2xx rule records one (and lookup then
  returns the usual message shape). Setting ``rules`` replaces the whole map.
* ``dedupe`` (default true): when false every POST is a new effect, but keys are still
  remembered for lookup.

Control API: ``GET|PUT /_stub/faults`` (unknown or invalid field -> 400 naming it),
``POST /_stub/reset``, ``GET /_stub/effects`` -> ``{"effects": {key: n}, "total": n}``,
``GET /_stub/requests`` -> ``{"requests": [{"key", "to", "at", "status", "outcome", "auth"}]}``
in arrival order (outcome is effect, replay, error, dropped or rejected; a dropped request logs
the status it would have had; ``auth`` is the sha256 hex of the Authorization header, or null
when there was none; payloads and secrets are never logged),
``GET /_stub/health`` -> ``{"ok": true}``.

Run it with ``python -m delivery.stub_provider --port 9090`` or in-process with
``with StubServer().start() as stub: ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import random
import secrets
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, cast
from urllib.parse import parse_qs

if TYPE_CHECKING:
    import httpx

__all__ = ["StubClient", "StubServer", "main"]

_MAX_BODY = 1 << 20
_JSON = "application/json"
_HTML = "text/html; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"

_DEFAULT_FAULTS: dict[str, Any] = {
    "drop_rate": 0.0,
    "delay_ms": 0,
    "error_rate": 0.0,
    "error_status": 503,
    "error_html": True,
    "retry_after": None,
    "fail_first": 0,
    "rules": {},
    "dedupe": True,
    "seed": None,
}

_HTML_503 = (
    b"<!DOCTYPE html>\n<html><head><title>503 Service Unavailable</title></head>\n"
    b"<body><h1>503 Service Unavailable</h1>\n"
    b"<p>The server is temporarily unable to service your request. Please try again later.</p>\n"
    b"</body></html>\n"
)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class _Rule(NamedTuple):
    status: int
    body: bytes
    content_type: str


class _Stored(NamedTuple):
    digest: bytes
    status: int
    body: bytes
    content_type: str


class _Answer(NamedTuple):
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


def _error(status: int, code: str, message: str | None = None) -> _Answer:
    doc: dict[str, Any] = {"code": code}
    if message is not None:
        doc["message"] = message
    return _Answer(status, _dumps(doc), _JSON)


# ---------------------------------------------------------------------------------------------
# Fault validation


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(cast(float, value))


def _compile_rules(field: str, value: object) -> dict[str, _Rule]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: must be an object mapping recipient -> rule")
    compiled: dict[str, _Rule] = {}
    for recipient, rule in value.items():
        where = f"{field}[{recipient!r}]"
        if not isinstance(recipient, str):
            raise ValueError(f"{where}: recipient must be a string")
        if not isinstance(rule, Mapping):
            raise ValueError(f"{where}: rule must be an object")
        unknown = sorted(set(rule) - {"status", "json", "body", "content_type"})
        if unknown:
            raise ValueError(f"{where}: unknown rule field {unknown[0]!r}")
        status = rule.get("status")
        if not _is_int(status) or not 100 <= cast(int, status) <= 599:
            raise ValueError(f"{where}.status: must be an integer 100..599")
        if "json" in rule and "body" in rule:
            raise ValueError(f"{where}: give either 'json' or 'body', not both")
        content_type = rule.get("content_type")
        if content_type is not None and not isinstance(content_type, str):
            raise ValueError(f"{where}.content_type: must be a string")
        if "json" in rule:
            try:
                body = _dumps(rule["json"])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}.json: not JSON-serialisable ({exc})") from None
            compiled[recipient] = _Rule(cast(int, status), body, content_type or _JSON)
        else:
            text = rule.get("body", "")
            if not isinstance(text, str):
                raise ValueError(f"{where}.body: must be a string")
            compiled[recipient] = _Rule(cast(int, status), text.encode(), content_type or _TEXT)
    return compiled


def _validate_faults(updates: Mapping[str, Any]) -> dict[str, Any]:
    """Return normalised copies of ``updates``; raise ValueError naming the bad field."""
    clean: dict[str, Any] = {}
    for field, value in updates.items():
        if field not in _DEFAULT_FAULTS:
            raise ValueError(f"unknown fault field: {field!r}")
        if field in ("drop_rate", "error_rate"):
            if not _is_number(value) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{field}: must be a number between 0 and 1")
            clean[field] = float(value)
        elif field in ("delay_ms", "fail_first"):
            if not _is_int(value) or value < 0:
                raise ValueError(f"{field}: must be a non-negative integer")
            clean[field] = value
        elif field == "error_status":
            if not _is_int(value) or not 400 <= value <= 599:
                raise ValueError(f"{field}: must be an integer 400..599")
            clean[field] = value
        elif field in ("error_html", "dedupe"):
            if not isinstance(value, bool):
                raise ValueError(f"{field}: must be a boolean")
            clean[field] = value
        elif field == "retry_after":
            if value is not None and (not _is_number(value) or value < 0):
                raise ValueError(f"{field}: must be a non-negative number or null")
            clean[field] = value
        elif field == "seed":
            if value is not None and not _is_int(value) and not isinstance(value, str):
                raise ValueError(f"{field}: must be an integer, a string or null")
            clean[field] = value
        else:  # rules
            _compile_rules(field, value)
            clean[field] = copy.deepcopy(dict(value))
    return clean


def _retry_after_header(value: float | int) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# ---------------------------------------------------------------------------------------------
# Shared state


class _State:
    """Everything the stub remembers; every access goes through ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: dict[str, Any] = {}
        self.rules: dict[str, _Rule] = {}
        self.rng = random.Random()
        self.effects: dict[str, int] = {}
        self.stored: dict[str, _Stored] = {}
        self.lookup: dict[str, bytes] = {}
        self.in_flight: set[str] = set()
        self.attempts: dict[str, int] = {}
        self.log: list[tuple[int, dict[str, Any]]] = []
        self.seq = 0
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.faults = copy.deepcopy(_DEFAULT_FAULTS)
            self.rules = {}
            self.rng = random.Random(None)
            self.effects = {}
            self.stored = {}
            self.lookup = {}
            self.in_flight = set()
            self.attempts = {}
            self.log = []

    def set_faults(self, updates: Mapping[str, Any]) -> dict[str, Any]:
        clean = _validate_faults(updates)
        rules = _compile_rules("rules", clean["rules"]) if "rules" in clean else None
        with self.lock:
            self.faults.update(clean)
            if rules is not None:
                self.rules = rules
            if "seed" in clean:
                self.rng = random.Random(clean["seed"])
            return copy.deepcopy(self.faults)

    def get_faults(self) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.faults)

    def get_effects(self) -> dict[str, int]:
        with self.lock:
            return dict(self.effects)

    def get_requests(self) -> list[dict[str, Any]]:
        with self.lock:
            entries = list(self.log)
        entries.sort(key=lambda item: item[0])
        return [dict(entry) for _, entry in entries]

    def next_seq(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq

    def record(
        self, seq: int, key: str, to: object, at: float, status: int, outcome: str, auth: str | None
    ) -> None:
        entry = {"key": key, "to": to, "at": at, "status": status, "outcome": outcome, "auth": auth}
        with self.lock:
            self.log.append((seq, entry))


# ---------------------------------------------------------------------------------------------
# HTTP server


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, host: str, port: int, state: _State) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.state = state
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that we do not need.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def close_connections(self) -> None:
        with self.connections_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # StreamRequestHandler sets TCP_NODELAY in setup()
    server_version = "stub-provider/1"
    sys_version = ""

    # --- plumbing -----------------------------------------------------------------------------

    @property
    def _srv(self) -> _Server:
        return cast(_Server, self.server)

    def setup(self) -> None:
        super().setup()
        srv = self._srv
        with srv.connections_lock:
            srv.connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            srv = self._srv
            with srv.connections_lock:
                srv.connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, answer: _Answer) -> None:
        status, body, content_type, headers = answer
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        head = [
            f"HTTP/1.1 {status} {reason}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
        ]
        for name, value in headers:
            head.append(f"{name}: {value}\r\n")
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
        if not 0 <= length <= _MAX_BODY:
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
                if total > _MAX_BODY:
                    raise ValueError("body too large")
                parts.append(self.rfile.read(size))
                self.rfile.readline(1024)
        except ValueError:
            self.close_connection = True
            return None

    def _route(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        if path == "/v1/messages":
            if method == "POST":
                self._post_message()
            elif method == "GET":
                self._send(self._lookup(query))
            else:
                self._send(_error(405, "METHOD_NOT_ALLOWED"))
        elif path.startswith("/_stub/"):
            self._send(self._control(method, path))
        else:
            self._send(_error(404, "NOT_FOUND"))

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    # --- provider API ---------------------------------------------------------------------------

    def _lookup(self, query: str) -> _Answer:
        keys = parse_qs(query).get("idempotency_key")
        if not keys:
            return _error(400, "INVALID_REQUEST", "idempotency_key query parameter is required")
        state = self._srv.state
        with state.lock:
            body = state.lookup.get(keys[0])
        if body is None:
            return _error(404, "NOT_FOUND")
        return _Answer(200, body, _JSON)

    def _post_message(self) -> None:
        at = time.time()
        state = self._srv.state
        seq = state.next_seq()
        key = self.headers.get("Idempotency-Key") or ""
        authorization = self.headers.get("Authorization")
        auth = None if authorization is None else hashlib.sha256(authorization.encode()).hexdigest()
        raw = self._read_body()
        to: object = None
        if raw is not None:
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = None
            if isinstance(payload, dict):
                to = payload.get("to")
        if not isinstance(to, str) or not to:
            if raw is None:
                answer = _error(400, "INVALID_REQUEST", "unreadable request body")
            else:
                answer = _error(400, "INVALID_REQUEST", "body must be a JSON object with 'to'")
            state.record(seq, key, to, at, 400, "rejected", auth)
            self._send(answer)
            return
        assert raw is not None
        digest = hashlib.sha256(raw).digest()

        claimed = False
        early: tuple[_Answer, str] | None = None
        with state.lock:
            delay_ms: int = state.faults["delay_ms"]
            if key and state.faults["dedupe"]:
                stored = state.stored.get(key)
                if key in state.in_flight:
                    early = (_error(409, "IDEMPOTENCY_IN_PROGRESS"), "rejected")
                elif stored is None:
                    state.in_flight.add(key)
                    claimed = True
                elif stored.digest == digest:
                    early = (_Answer(stored.status, stored.body, stored.content_type), "replay")
                else:
                    message = "Idempotency-Key was already used with a different request body"
                    early = (_error(422, "IDEMPOTENCY_KEY_REUSED", message), "rejected")
        if early is not None:
            answer, outcome = early
            state.record(seq, key, to, at, answer.status, outcome, auth)
            self._send(answer)
            return

        try:
            if delay_ms:
                time.sleep(delay_ms / 1000.0)
        except BaseException:
            if claimed:
                with state.lock:
                    state.in_flight.discard(key)
            raise
        answer, outcome = self._process(state, key, to, digest, claimed)
        state.record(seq, key, to, at, answer.status, outcome, auth)
        if outcome == "dropped":
            self.close_connection = True
            return
        self._send(answer)

    @staticmethod
    def _process(
        state: _State, key: str, to: str, digest: bytes, claimed: bool
    ) -> tuple[_Answer, str]:
        # One critical section: the key goes from in flight to stored with no gap between.
        with state.lock:
            try:
                return _Handler._process_locked(state, key, to, digest)
            finally:
                if claimed:
                    state.in_flight.discard(key)

    @staticmethod
    def _process_locked(state: _State, key: str, to: str, digest: bytes) -> tuple[_Answer, str]:
        faults = state.faults
        rule = state.rules.get(to)
        if rule is not None and not 200 <= rule.status < 300:
            return _Answer(rule.status, rule.body, rule.content_type), "rejected"
        if rule is None:
            attempts = state.attempts.get(key, 0) + 1
            state.attempts[key] = attempts
            error_rate: float = faults["error_rate"]
            if attempts <= faults["fail_first"] or (error_rate and state.rng.random() < error_rate):
                return _provider_error(faults), "error"
        message = _dumps({"id": "msg_" + secrets.token_hex(12), "to": to, "status": "accepted"})
        if rule is None:
            answer = _Answer(201, message, _JSON)
        else:
            answer = _Answer(rule.status, rule.body, rule.content_type)
        state.effects[key] = state.effects.get(key, 0) + 1
        if key:
            state.lookup[key] = message
            if faults["dedupe"]:
                state.stored[key] = _Stored(digest, *answer[:3])
        drop_rate: float = faults["drop_rate"]
        if drop_rate and state.rng.random() < drop_rate:
            return answer, "dropped"
        return answer, "effect"

    # --- control API ----------------------------------------------------------------------------

    def _control(self, method: str, path: str) -> _Answer:
        state = self._srv.state
        name = path[len("/_stub/") :]
        allowed = {
            "faults": ("GET", "PUT"),
            "reset": ("POST",),
            "effects": ("GET",),
            "requests": ("GET",),
            "health": ("GET",),
        }.get(name)
        if allowed is None:
            return _error(404, "NOT_FOUND")
        if method not in allowed:
            return _error(405, "METHOD_NOT_ALLOWED")
        if name == "faults":
            if method == "GET":
                return _Answer(200, _dumps(state.get_faults()), _JSON)
            raw = self._read_body()
            try:
                updates = json.loads(raw) if raw else None
            except ValueError:
                updates = None
            if not isinstance(updates, dict):
                return _error(400, "INVALID_REQUEST", "body must be a JSON object")
            try:
                return _Answer(200, _dumps(state.set_faults(updates)), _JSON)
            except ValueError as exc:
                return _error(400, "INVALID_FAULT", str(exc))
        if name == "reset":
            self._read_body()
            state.reset()
            return _Answer(200, _dumps({"ok": True}), _JSON)
        if name == "effects":
            effects = state.get_effects()
            doc = {"effects": effects, "total": sum(effects.values())}
            return _Answer(200, _dumps(doc), _JSON)
        if name == "requests":
            return _Answer(200, _dumps({"requests": state.get_requests()}), _JSON)
        return _Answer(200, _dumps({"ok": True}), _JSON)


def _provider_error(faults: Mapping[str, Any]) -> _Answer:
    status: int = faults["error_status"]
    retry_after = faults["retry_after"]
    headers: tuple[tuple[str, str], ...] = ()
    if retry_after is not None:
        headers = (("Retry-After", _retry_after_header(retry_after)),)
    if status == 503 and faults["error_html"]:
        return _Answer(status, _HTML_503, _HTML, headers)
    code = "RATE_LIMITED" if status == 429 else "PROVIDER_ERROR"
    return _Answer(status, _dumps({"code": code}), _JSON, headers)


# ---------------------------------------------------------------------------------------------
# Public API


class StubServer:
    """The stub provider, bound at construction; ``start()`` serves it from a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._state = _State()
        self._httpd = _Server(host, port, self._state)
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
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> StubServer:
        """Serve from a daemon thread (idempotent) and return self."""
        with self._lock:
            if self._closed:
                raise RuntimeError("stub server is stopped")
            if self._thread is None:
                self._serving = True
                self._thread = threading.Thread(
                    target=self._serve, name=f"stub-provider:{self.port}", daemon=True
                )
                self._thread.start()
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
        """Stop serving, drop open connections and release the port (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            serving = self._serving
        if serving:
            self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Merge ``faults`` into the current faults and return them all; ValueError if bad."""
        return self._state.set_faults(faults)

    def faults(self) -> dict[str, Any]:
        return self._state.get_faults()

    def reset(self) -> None:
        """Restore default faults and forget effects, stored messages and the request log."""
        self._state.reset()

    def effects(self) -> dict[str, int]:
        return self._state.get_effects()

    def requests(self) -> list[dict[str, Any]]:
        return self._state.get_requests()


class StubClient:
    """The control API of a stub running elsewhere (another process), over HTTP."""

    def __init__(self, url: str) -> None:
        import httpx

        self.url = url.rstrip("/")
        self._http: httpx.Client = httpx.Client(base_url=self.url, timeout=10.0)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> StubClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code == 400:
            raise ValueError(response.json().get("message", response.text))
        response.raise_for_status()
        return response.json()

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Merge ``faults`` into the stub's faults and return them all; ValueError if bad."""
        return cast(dict[str, Any], self._json(self._http.put("/_stub/faults", json=faults)))

    def faults(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(self._http.get("/_stub/faults")))

    def reset(self) -> None:
        self._json(self._http.post("/_stub/reset"))

    def effects(self) -> dict[str, int]:
        return cast(dict[str, int], self._json(self._http.get("/_stub/effects"))["effects"])

    def requests(self) -> list[dict[str, Any]]:
        doc = self._json(self._http.get("/_stub/requests"))
        return cast(list[dict[str, Any]], doc["requests"])

    def health(self) -> bool:
        """True when the stub answers its health check; False if it is unreachable."""
        import httpx

        try:
            response = self._http.get("/_stub/health")
        except httpx.TransportError:
            return False
        return response.status_code == 200 and response.json().get("ok") is True


# ---------------------------------------------------------------------------------------------
# CLI


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Run the stub in the foreground until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m delivery.stub_provider",
        description="Fault-injecting stub of the reference message provider.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument(
        "--port", type=int, default=9090, help="port to bind, 0 for any (default %(default)s)"
    )
    args = parser.parse_args(argv)
    stub = StubServer(args.host, args.port)
    in_main_thread = threading.current_thread() is threading.main_thread()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in signals}
    if in_main_thread:
        for signum in signals:  # also when SIGINT was ignored (e.g. started with `&`)
            signal.signal(signum, _interrupt)
    print(f"stub provider listening on {stub.url}", flush=True)
    try:
        stub.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stub.stop()
        if in_main_thread:
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)


if __name__ == "__main__":
    main()
