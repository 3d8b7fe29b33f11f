"""Stubs of real providers' wire contracts, over real HTTP on 127.0.0.1 (port 0, a thread).

Each stub records every request and answers with the shapes the real API answers with:
Twilio's Messages API (JSON errors ``{"code", "message", "more_info", "status"}``, message
resources, paged lists), pigeon's ``/api/send-email`` (``{"emailId"}``, errors
``{"error", "code"}``, an HTML 503 from its proxy, idempotency keys) and a Standard Webhooks
receiver that verifies signatures with its own implementation.

Faults are scripted with ``push(Reply(...))``: a ``Reply`` with a ``status`` answers that
instead of the provider (no effect); one without a status lets the provider act and then
delays (``delay``) or drops (``drop``: the connection closes with no answer) its answer.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import itertools
import json
import re
import secrets
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

__all__ = ["PigeonStub", "Recorded", "Reply", "StubServer", "TwilioStub", "WebhookReceiver"]


@dataclass(frozen=True)
class Recorded:
    """One request as the stub received it (header names in lower case)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode(), keep_blank_values=True).items()}


@dataclass(frozen=True)
class Reply:
    """An answer. ``status`` None: the provider's own answer (and effect), delayed or dropped."""

    status: int | None = None
    json: Any = None
    body: str | bytes | None = None
    content_type: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False


class QuietHTTPServer(ThreadingHTTPServer):
    """Every test's HTTP server in the test process (request threads are daemons). A client
    that hung up mid-answer is the client's doing: nothing printed. Any other error is one
    line, never a traceback: on Python 3.11 printing a traceback parses source with ``ast``
    (its caret marks), whose state is not thread-safe there, so a server thread printing one
    while a test parses modules (test_layout, test_public_apis) made that parse fail with
    "AST constructor recursion depth mismatch"."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (BrokenPipeError, ConnectionResetError)):
            return
        sys.stderr.write(f"test server {self.server_address}: {error!r}\n")


class StubServer:
    """A QuietHTTPServer on 127.0.0.1:0 in a daemon thread; ``answer`` is the contract."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self._script: dict[str, deque[Reply]] = defaultdict(deque)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                stub._serve(self)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> StubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def push(self, *replies: Reply, method: str = "POST", path: str = "*") -> None:
        """Script the next answers to ``method`` requests (on ``path``, or any path)."""
        with self.lock:
            self._script[f"{method} {path}"].extend(replies)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self._script.clear()

    def sent(self, method: str = "POST") -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.method == method]

    def _next_scripted(self, method: str, path: str) -> Reply | None:
        with self.lock:
            for key in (f"{method} {path}", f"{method} *"):
                if self._script[key]:
                    return self._script[key].popleft()
        return None

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        parts = urlsplit(handler.path)
        request = Recorded(
            handler.command,
            parts.path,
            parse_qs(parts.query, keep_blank_values=True),
            {k.lower(): v for k, v in handler.headers.items()},
            body,
        )
        with self.lock:
            self.requests.append(request)
        scripted = self._next_scripted(request.method, request.path)
        if scripted is not None and scripted.status is not None:
            reply = scripted
        else:
            reply = self.answer(request)
        if scripted is not None and scripted.delay:
            time.sleep(scripted.delay)
        if scripted is not None and scripted.drop:
            handler.close_connection = True
            return
        self._write(handler, reply)

    def answer(self, request: Recorded) -> Reply:
        return Reply(404, {"error": "not found"})

    @staticmethod
    def _write(handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        if reply.json is not None:
            payload = json.dumps(reply.json).encode()
            content_type = reply.content_type or "application/json"
        else:
            raw = reply.body or b""
            payload = raw.encode() if isinstance(raw, str) else raw
            content_type = reply.content_type or "text/plain; charset=utf-8"
        handler.send_response(reply.status or 200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(payload)


# --- Twilio ---------------------------------------------------------------------------------


def twilio_error(code: int, message: str, status: int = 400) -> Reply:
    """Twilio's error body, as its API answers it."""
    return Reply(
        status,
        {
            "code": code,
            "message": message,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status,
        },
    )


def _rfc2822(when: dt.datetime | None) -> str | None:
    if when is None:
        return None
    return email.utils.format_datetime(when.astimezone(dt.UTC)).replace("-0000", "+0000")


def _sent_at(message: Mapping[str, Any]) -> dt.datetime | None:
    stamp = message.get("date_sent")
    return email.utils.parsedate_to_datetime(stamp) if stamp else None


class TwilioStub(StubServer):
    """Twilio's Messages API for one account: create (form, basic auth) and list (paged)."""

    def __init__(self, account_sid: str, auth_token: str, page_size_cap: int = 1000) -> None:
        super().__init__()
        self.account_sid, self.auth_token = account_sid, auth_token
        self.messages: list[dict[str, Any]] = []  # oldest first
        self.rules: dict[str, Reply] = {}  # To -> error answer
        # To -> (status, error_code) that Twilio later reports on messages created to it
        self.reports: dict[str, tuple[str, int | None]] = {}
        self.page_size_cap = page_size_cap
        self._path = f"/2010-04-01/Accounts/{account_sid}/Messages.json"

    def add_message(
        self,
        to: str,
        body: str,
        created: dt.datetime,
        sender: str,
        *,
        status: str = "queued",
        error_code: int | None = None,
        sent: dt.datetime | None = None,
    ) -> dict[str, Any]:
        """A message that exists already (sent by someone, some time ago), as Twilio reports
        it now: ``status``, ``error_code`` and ``date_sent`` (``sent``; none while queued)."""
        message = self._store(to, sender, body, created)
        with self.lock:
            message.update(status=status, error_code=error_code, date_sent=_rfc2822(sent))
        return message

    def _store(self, to: str, sender: str, body: str, created: dt.datetime) -> dict[str, Any]:
        sid = "SM" + secrets.token_hex(16)
        stamp = _rfc2822(created)
        status, error_code = self.reports.get(to, ("queued", None))
        message = {
            "account_sid": self.account_sid,
            "api_version": "2010-04-01",
            "body": body,
            "date_created": stamp,
            "date_sent": None,
            "date_updated": stamp,
            "direction": "outbound-api",
            "error_code": error_code,
            "error_message": None,
            "from": sender,
            "messaging_service_sid": None,
            "num_media": "0",
            "num_segments": "1",
            "price": None,
            "price_unit": "USD",
            "sid": sid,
            "status": status,
            "subresource_uris": {"media": f"{self._path[:-5]}/{sid}/Media.json"},
            "to": to,
            "uri": f"{self._path[:-5]}/{sid}.json",
        }
        with self.lock:
            self.messages.append(message)
        return message

    def answer(self, request: Recorded) -> Reply:
        auth = request.headers.get("authorization", "")
        expected = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        if auth != f"Basic {expected}":
            return twilio_error(20003, "Authenticate", 401)
        if request.path != self._path:
            return twilio_error(20404, f"The requested resource {request.path} was not found", 404)
        if request.method == "GET":
            return self._list(request)
        if request.method != "POST":
            return twilio_error(20004, "Method not allowed", 405)
        form = request.form()
        to = form.get("To", "")
        if not to:
            return twilio_error(21604, "A 'To' phone number is required.")
        sender = form.get("From") or form.get("MessagingServiceSid", "")
        if not sender:
            return twilio_error(21603, "A 'From' phone number is required.")
        if not form.get("Body"):
            return twilio_error(21602, "Message body is required.")
        if to in self.rules:
            return self.rules[to]
        message = self._store(to, sender, form["Body"], dt.datetime.now(dt.UTC))
        return Reply(201, message)

    def _list(self, request: Recorded) -> Reply:
        q = {k: v[0] for k, v in request.query.items()}
        size = min(int(q.get("PageSize", 50)), self.page_size_cap)
        page = int(q.get("Page", 0))
        with self.lock:  # Twilio's order: by date_sent, newest first; unsent ones have none
            rows = [
                m
                for m in reversed(self.messages)
                if m["to"] == q.get("To", m["to"]) and m["from"] == q.get("From", m["from"])
            ]
        oldest = dt.datetime.min.replace(tzinfo=dt.UTC)  # unsent ones last, newest created first
        rows.sort(key=lambda m: _sent_at(m) or oldest, reverse=True)
        chunk = rows[page * size : (page + 1) * size]
        keep = {k: q[k] for k in ("To", "From") if k in q}
        base = f"{self._path}?{urlencode({**keep, 'PageSize': size})}"
        has_next = (page + 1) * size < len(rows)
        return Reply(
            200,
            {
                "end": page * size + max(len(chunk) - 1, 0),
                "first_page_uri": f"{base}&Page=0",
                "messages": chunk,
                "next_page_uri": f"{base}&Page={page + 1}&PageToken=PA{page + 1}"
                if has_next
                else None,
                "page": page,
                "page_size": size,
                "previous_page_uri": f"{base}&Page={page - 1}" if page else None,
                "start": page * size,
                "uri": f"{base}&Page={page}",
            },
        )

    def sends_to(self, to: str) -> list[dict[str, Any]]:
        with self.lock:
            return [m for m in self.messages if m["to"] == to]


# --- pigeon ---------------------------------------------------------------------------------

PIGEON_503_HTML = (
    "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n"
    "<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n"
    "<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


def pigeon_error(status: int, code: str, error: str) -> Reply:
    return Reply(status, {"error": error, "code": code})


class PigeonStub(StubServer):
    """pigeon's ``/api/send-email``: bearer key, Idempotency-Key replays, SMTP inside the call.

    ``smtp_seconds`` is how long the (simulated) SMTP conversation takes; a second request with
    the key of one still in it gets 409 ``IDEMPOTENCY_IN_PROGRESS``. ``effects`` counts the
    emails actually sent per key (the user's inbox).
    """

    def __init__(self, api_key: str) -> None:
        super().__init__()
        self.api_key = api_key
        self.smtp_seconds = 0.0
        self.effects: dict[str, int] = defaultdict(int)
        self.rules: dict[str, Reply] = {}  # recipient -> answer (e.g. SMTP_DELIVERY_REJECTED)
        self._done: dict[str, dict[str, Any]] = {}
        self._in_flight: set[str] = set()
        self._ids = itertools.count(1001)

    def answer(self, request: Recorded) -> Reply:
        if request.path != "/api/send-email" or request.method != "POST":
            return pigeon_error(404, "NOT_FOUND", "Not found")
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return pigeon_error(401, "UNAUTHORIZED", "Invalid or missing API key")
        try:
            data = request.json()
        except ValueError:
            return pigeon_error(400, "VALIDATION_ERROR", "Body must be JSON")
        missing = [f for f in ("to", "subject", "templateId") if not data.get(f)]
        if missing:
            return pigeon_error(400, "VALIDATION_ERROR", f"Missing fields: {', '.join(missing)}")
        key = request.headers.get("idempotency-key") or secrets.token_hex(8)
        with self.lock:
            if key in self._done:
                return Reply(200, self._done[key])
            if key in self._in_flight:
                return pigeon_error(
                    409, "IDEMPOTENCY_IN_PROGRESS", "A request with this key is in progress"
                )
            self._in_flight.add(key)
        try:
            time.sleep(self.smtp_seconds)
            rule = self.rules.get(str(data["to"]))
            if rule is not None:
                return rule
            with self.lock:
                self.effects[key] += 1
                answer = {"emailId": next(self._ids)}
                self._done[key] = answer
            return Reply(200, answer)
        finally:
            with self.lock:
                self._in_flight.discard(key)


# --- Standard Webhooks receiver ---------------------------------------------------------------


def verify_standard_webhook(secret: str, headers: Mapping[str, str], body: bytes) -> bool:
    """The receiver's side of Standard Webhooks: the reference library's own ``verify``
    (``standardwebhooks.Webhook``), written apart from ``delivery``'s signer."""
    try:
        Webhook(secret).verify(body, dict(headers))
    except WebhookVerificationError:
        return False
    return True


_HOOK_PATH = re.compile(r"^/hooks/[\w.-]+$")


class WebhookReceiver(StubServer):
    """An app's webhook endpoint: verifies each request's signature (401 if wrong), dedupes on
    ``webhook-id`` (``receipts`` counts verified receipts per id) and answers 204."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret
        self.receipts: dict[str, int] = defaultdict(int)
        self.verified: list[bool] = []

    def answer(self, request: Recorded) -> Reply:
        if not _HOOK_PATH.match(request.path) or request.method != "POST":
            return Reply(404, body="no such hook")
        ok = verify_standard_webhook(self.secret, request.headers, request.body)
        with self.lock:
            self.verified.append(ok)
        if not ok:
            return Reply(401, {"error": "bad signature"})
        with self.lock:
            self.receipts[request.headers["webhook-id"]] += 1
        return Reply(204)


# --- settings for one provider, as a TOML file would give them --------------------------------


def settings_with(
    providers: Mapping[str, Mapping[str, Any]],
    channels: Mapping[str, Mapping[str, Any]] | None = None,
    **tables: Any,
) -> Any:
    """Validated ``Settings`` from TOML-shaped tables (no database is opened)."""
    from delivery.config.loading import settings_from_mapping

    data: dict[str, Any] = {"providers": dict(providers), **tables}
    if channels is not None:
        data["channels"] = dict(channels)
    return settings_from_mapping(
        data, database_url="sqlite://", broker_url="memory://", redis_url=None
    )


def provider_from(table: Mapping[str, Any], name: str = "p", **tables: Any) -> Any:
    """A live adapter built through the registry from one ``[providers.NAME]`` table."""
    from delivery.providers import build_provider

    return build_provider(settings_with({name: table}, **tables).providers[name])
