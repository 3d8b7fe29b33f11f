"""The receipt receiver: a WSGI app for ``POST /receipts/{provider}`` (docs/operations.md,
"The receipt receiver"). It has no framework: ``delivery receiver`` serves it with Granian;
``respond`` is its one answer to a request, which the Flask blueprint and the Django view of
``delivery.contrib`` call too.

A receipt is acknowledged (200) only once it is stored: its row and its message's move commit
together (``delivery.transitions.receipts.record_many``) before the answer, in one transaction
with the other receipts that arrived meanwhile (``group_commit``). The answers:

- 200: stored (a duplicate too); also a receipt for a message we do not know (so the provider
  stops retrying), which is counted and logged by the provider's reference only;
- 400: a malformed receipt, naming the field; 403: a missing or wrong signature; nothing is
  written for either;
- 404: not a provider with receipts (``delivery.receipts.protocols``); 405: not a POST;
- 411 / 413: a body without a length / over ``MAX_BODY`` bytes, refused before it is read;
- 503 with ``Retry-After``: the database did not answer (down, or slower than its short
  timeouts): the provider retries later, and no receipt is acknowledged and lost.

``GET /metrics`` serves its counters for Prometheus: ``delivery_receipts_total{provider,
status}`` (stored, duplicates aside), ``delivery_receipts_refused_total{provider,answer}`` and
the histogram ``delivery_receipt_lag_seconds{provider}`` (accept -> delivered, for the
receipts that moved a message to ``delivered`` here).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from sqlalchemy import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from delivery.config.settings import Settings
from delivery.core import bounds
from delivery.core.models import Message
from delivery.core.status import Status
from delivery.errors import ConfigError, InvalidReceipt
from delivery.guards.suppression import Suppressions
from delivery.observability.metrics import served_registry
from delivery.ops.audit import record as audit
from delivery.receipts.fields import SignatureRefused
from delivery.receipts.group_commit import GroupCommit
from delivery.receipts.protocols import ReceiptProtocol, protocols
from delivery.runtime.db import check_outbox, make_engine
from delivery.transitions import tell_outcomes_after
from delivery.transitions.receipts import ReceiptEvent, Recorded, record_many

__all__ = ["MAX_BODY", "RETRY_AFTER", "Answer", "Receiver", "Request", "make_receiver"]

log = logging.getLogger("delivery.receipts")

MAX_BODY = 16 * 1024
"""The largest receipt body read, in bytes: a receipt is a few hundred."""
RETRY_AFTER = 5
"""Seconds a provider is asked to wait when the database does not answer."""
DB_WAIT = 2.0
"""Seconds the receiver waits on the database (connect, a statement, a pooled connection)."""
STORE_WAIT = 3 * DB_WAIT
"""Seconds a request waits for its receipt's batch to be stored before it answers 503."""
LAG_BUCKETS = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 6 * 3600, 24 * 3600)
"""``delivery_receipt_lag_seconds``' buckets: an SMS is delivered in seconds, an email's
receipt may take hours."""
_PREFIX = "/receipts/"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def make_receiver(settings: Settings, environ: Mapping[str, str] | None = None) -> Receiver:
    """The receiver of ``settings``' outbox, refusing to be built broken: ``ConfigError`` when
    no provider has receipts, a secret is missing, or the outbox is not reachable and migrated.
    Its engine waits for the database briefly (``DB_WAIT`` s to connect, to run a statement,
    or for a pooled connection), so that a slow or stopped database is a quick 503."""
    checks = protocols(settings, environ)
    if not checks:
        raise ConfigError(
            "providers",
            "no provider has receipt_secret_env (kind http) or status_callback_url (kind "
            "twilio): there are no receipts to receive",
        )
    check_outbox(settings.database_url)
    args: dict[str, Any] = {}
    if make_url(settings.database_url).get_backend_name() == "postgresql":
        timeout = f"-c statement_timeout={int(DB_WAIT * 1000)}"
        args = {"connect_args": {"connect_timeout": max(1, round(DB_WAIT)), "options": timeout}}
    engine = make_engine(settings.database_url, pool_timeout=DB_WAIT, **args)
    return Receiver(engine, checks, Suppressions(settings, environ))


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer: its HTTP status line, JSON body and extra headers; ``counted``: the label
    it adds to ``delivery_receipts_refused_total`` (None: a receipt stored, or not counted)."""

    status: str
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()
    counted: str | None = None

    @property
    def code(self) -> int:
        """The HTTP status code (``status`` without its reason)."""
        return int(self.status.split()[0])


@dataclass(frozen=True, slots=True)
class Request:
    """One request to ``/receipts/{provider}``, as any server hands it over: ``length`` bytes
    to read from ``body`` (-1: no length given), ``headers`` with names in lower case, and the
    query string as it arrived."""

    provider: str
    method: str
    length: int
    body: IO[bytes]
    headers: Mapping[str, str]
    query: str = ""


def _refused(status: str, error: str, *headers: tuple[str, str]) -> Answer:
    return Answer(status, {"error": error}, headers, status.split()[0])  # the code, as a label


class Receiver:
    """The WSGI app: receipts of the providers in ``checks`` into ``engine``'s outbox."""

    def __init__(
        self,
        engine: Engine,
        checks: Mapping[str, ReceiptProtocol],
        suppressions: Suppressions | None = None,
    ) -> None:
        self.engine, self.checks, self.suppressions = engine, dict(checks), suppressions
        self.registry = CollectorRegistry()
        self.stored = Counter(
            "delivery_receipts",
            "Delivery receipts stored (a repeated event once)",
            ["provider", "status"],
            registry=self.registry,
        )
        self.refused = Counter(
            "delivery_receipts_refused",
            "Receipts answered but not stored, by answer (unknown: no such message)",
            ["provider", "answer"],
            registry=self.registry,
        )
        self.lag = Histogram(
            "delivery_receipt_lag_seconds",
            "Seconds from the provider's accept to its delivered receipt",
            ["provider"],
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self._metrics = make_wsgi_app(served_registry(self.registry))
        self._commits = GroupCommit(self._store_batch)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "")
        if path == "/metrics" and method == "GET":
            return cast(Iterable[bytes], self._metrics(environ, start_response))
        headers = {
            name[5:].replace("_", "-").lower(): value
            for name, value in environ.items()
            if name.startswith("HTTP_")
        }
        try:
            length = int(environ.get("CONTENT_LENGTH") or -1)
        except ValueError:
            length = -1
        provider = path[len(_PREFIX) :] if path.startswith(_PREFIX) else ""
        query = environ.get("QUERY_STRING", "")
        request = Request(provider, method, length, environ["wsgi.input"], headers, query)
        answer = self.respond(request)
        payload = json.dumps(answer.body).encode()
        sized = [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
        start_response(answer.status, [*sized, *answer.headers])
        return [payload]

    def respond(self, request: Request) -> Answer:
        """The answer to ``request``, once its receipt is stored (or why it was not)."""
        if request.provider not in self.checks:
            return Answer("404 Not Found", {"error": "no receipts for this path"})
        answer = self._answer(request)
        if answer.counted is not None:
            self.refused.labels(request.provider, answer.counted).inc()
        return answer

    def _answer(self, request: Request) -> Answer:
        provider, length = request.provider, request.length
        if request.method != "POST":
            allow = (("Allow", "POST"),)
            return Answer("405 Method Not Allowed", {"error": "POST a receipt"}, allow)
        if length < 0:
            return _refused("411 Length Required", "send the receipt with a Content-Length")
        if length > MAX_BODY:
            return _refused("413 Content Too Large", f"a receipt is at most {MAX_BODY} bytes")
        body = request.body.read(length)
        try:
            receipt = self.checks[provider].read(body, request.headers, request.query)
        except SignatureRefused:
            log.warning("receipt for %s refused: bad or missing signature", provider)
            return _refused("403 Forbidden", "bad or missing signature")
        except InvalidReceipt as exc:
            answer = _refused("400 Bad Request", str(exc))
            return Answer(answer.status, {**answer.body, "field": exc.field}, (), answer.counted)
        try:
            known = self._store(receipt)
        except (SQLAlchemyError, TimeoutError) as exc:
            problem = type(exc).__name__
            log.warning("receipt %s of %s not stored: %s", receipt.event, provider, problem)
            retry = ("Retry-After", str(RETRY_AFTER))
            return _refused("503 Service Unavailable", "not stored, try again later", retry)
        if not known:
            log.info(
                "receipt %s of %s for a message we do not know (ref %s)",
                receipt.event,
                provider,
                _ref(body),
            )
            return Answer("200 OK", {"ok": True}, (), "unknown")
        return Answer("200 OK", {"ok": True})

    def _store(self, receipt: ReceiptEvent) -> bool:
        """Store ``receipt`` with the others arriving meanwhile (``GroupCommit``) and count
        it; False if no message has its key."""
        done = self._commits.submit(receipt, STORE_WAIT)
        if done.effect is not None:
            self.stored.labels(receipt.provider, receipt.status).inc()
            if done.lag is not None:
                self.lag.labels(receipt.provider).observe(done.lag)
            log.info(
                "receipt %s of %s for %s: %s (%s)",
                receipt.event,
                receipt.provider,
                receipt.key,
                receipt.status,
                done.effect.value,
            )
        return done.message_id is not None

    def _store_batch(self, receipts: Sequence[ReceiptEvent]) -> list[Recorded]:
        """Store ``receipts`` and make their moves in one transaction. A receipt that
        resolves an ``unknown`` message is audited as the receipt's doing."""
        with tell_outcomes_after(), self.engine.begin() as conn:
            recorded = record_many(conn, receipts)
            for receipt, done in zip(receipts, recorded, strict=True):
                self._suppress(conn, receipt, done)
                if done.moved_from is Status.UNKNOWN and done.message_id is not None:
                    with Session(bind=conn) as session:  # the audit, in the same transaction
                        audit(
                            session,
                            actor=f"receipt:{receipt.provider}",
                            action="resolve",
                            message=session.get(Message, done.message_id),
                            from_status=Status.UNKNOWN.value,
                            to_status=receipt.status,
                            detail=f"receipt {receipt.event}",
                        )
        return recorded

    def _suppress(self, conn: Connection, receipt: ReceiptEvent, done: Recorded) -> None:
        """A new ``undelivered`` receipt with a code of its protocol's ``suppressing`` puts
        its recipient on the channel's suppression list, in the receipt's transaction."""
        protocol = self.checks[receipt.provider]
        if (
            self.suppressions is None
            or done.effect is None
            or done.channel is None
            or done.recipient is None
            or receipt.status != "undelivered"
            or receipt.code not in protocol.suppressing
        ):
            return
        source = f"receipt:{receipt.provider} {receipt.event}"
        if self.suppressions.add(
            conn, done.channel, done.recipient, code=receipt.code, source=source
        ):
            log.info(
                "receipt %s of %s: recipient suppressed (%s)",
                receipt.event,
                receipt.provider,
                receipt.code,
            )


def _ref(body: bytes) -> str:
    """The provider's reference of the message a receipt names, bounded, for a log line."""
    try:
        ref = json.loads(body).get("id")
    except (ValueError, AttributeError):
        ref = None
    return bounds.text(ref, 64) if ref else "?"
