"""What the stub remembers: faults, effects per key, stored answers, the request log; and the
receipts: their config, their log, their queue and the daemon thread that POSTs them."""

from __future__ import annotations

import copy
import heapq
import http.client
import itertools
import random
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from delivery.testing.stub_provider.answers import (
    DEFAULT_FAULTS,
    DEFAULT_RECEIPTS,
    JSON,
    ReceiptRule,
    Rule,
    compile_receipt_rules,
    compile_rules,
    receipt_body,
    receipts_view,
    sign_receipt,
    validate_faults,
    validate_receipts,
)

__all__ = ["Logged", "Receipt", "State", "Stored", "post_receipt"]

RECEIPT_TIMEOUT = 5.0


class Stored(NamedTuple):
    digest: bytes
    status: int
    body: bytes
    content_type: str


class Logged(NamedTuple):
    """One entry of ``GET /_stub/requests`` (never a payload or a secret)."""

    key: str
    to: object
    at: float
    status: int
    outcome: str  # effect, replay, error, dropped or rejected
    auth: str | None  # sha256 hex of the Authorization header


class Receipt(NamedTuple):
    """One delivery of a receipt event (a duplicate is a second one), as queued to be POSTed."""

    event: str  # webhook-id
    key: str
    status: str
    body: bytes
    url: str
    secret: str
    max_tries: int
    retry_ms: int
    duplicate: bool  # the event is delivered twice
    generation: int  # reset() bumps State.generation: older deliveries are forgotten
    tries: int = 0  # POSTs of this delivery so far


class State:
    """Everything the stub remembers; every access goes through ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.receipts_due = threading.Condition(self.lock)
        self.seq = 0
        self.generation = 0
        self.order = itertools.count()
        self.sender: threading.Thread | None = None
        self.posting = 0  # receipts taken off the queue whose POST has not been logged yet
        self.closed = False
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.faults: dict[str, Any] = copy.deepcopy(DEFAULT_FAULTS)
            self.rules: dict[str, Rule] = {}
            self.rng = random.Random(None)
            self.effects: dict[str, int] = {}
            self.stored: dict[str, Stored] = {}
            self.lookup: dict[str, bytes] = {}
            self.in_flight: set[str] = set()
            self.attempts: dict[str, int] = {}
            self.log: list[tuple[int, dict[str, Any]]] = []
            self.receipts: dict[str, Any] = copy.deepcopy(DEFAULT_RECEIPTS)
            self.receipt_rules: dict[str, ReceiptRule] = {}
            self.receipt_rng = random.Random(None)
            self.sent: dict[str, dict[str, Any]] = {}  # webhook-id -> entry, first attempted first
            self.queue: list[tuple[float, int, Receipt]] = []  # (monotonic due time, order, ...)
            self.generation += 1
            self.receipts_due.notify_all()

    def set_faults(self, updates: Mapping[str, Any]) -> dict[str, Any]:
        clean = validate_faults(updates)
        rules = compile_rules("rules", clean["rules"]) if "rules" in clean else None
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

    def record(self, seq: int, request: Logged) -> None:
        """Log one request; ``seq`` orders the log by arrival, whenever it is answered."""
        with self.lock:
            self.log.append((seq, request._asdict()))

    # --- receipts ---------------------------------------------------------------------------

    def set_receipts(self, updates: Mapping[str, Any]) -> dict[str, Any]:
        """Merge ``updates`` into the receipts' config and return it (as the control API shows
        it); ValueError naming the bad field."""
        with self.lock:
            clean = validate_receipts(updates, self.receipts)
            rules = compile_receipt_rules("rules", clean["rules"]) if "rules" in clean else None
            self.receipts.update(clean)
            if rules is not None:
                self.receipt_rules = rules
            if "seed" in clean:
                self.receipt_rng = random.Random(clean["seed"])
            return receipts_view(self.receipts)

    def get_receipts(self) -> dict[str, Any]:
        with self.lock:
            return {
                "config": receipts_view(self.receipts),
                "sent": [dict(entry) for entry in self.sent.values()],
                "queued": len(self.queue) + self.posting,
            }

    def queue_receipts_locked(self, msg_id: str, key: str, to: str) -> None:
        """Queue the receipts of one effect (the caller holds ``lock``): its sequence of
        statuses, each event with a webhook-id of its own, maybe a duplicate delivery."""
        config = self.receipts
        url: str | None = config["url"]
        if url is None or self.closed:
            return
        rng = self.receipt_rng
        never_rate: float = config["never_rate"]
        if never_rate and rng.random() < never_rate:
            return
        statuses: list[str] = list(config["statuses"])
        codes: list[str | None] = [None] * len(statuses)
        rule = self.receipt_rules.get(to)
        if rule is not None:
            statuses[-1], codes[-1] = rule.status, rule.code
        delay_ms: int = config["delay_ms"]
        at_ms = int(time.time() * 1000) + delay_ms  # the provider's event time, 1 ms apart
        events = [
            (status, receipt_body(msg_id, key, status, code, at_ms + i))
            for i, (status, code) in enumerate(zip(statuses, codes, strict=True))
        ]
        if config["reorder"]:
            events.reverse()
        due = time.monotonic() + delay_ms / 1000.0
        duplicate_rate: float = config["duplicate_rate"]
        for status, body in events:
            receipt = Receipt(
                event="evt_" + secrets.token_hex(12),
                key=key,
                status=status,
                body=body,
                url=url,
                secret=config["secret"],
                max_tries=config["max_tries"],
                retry_ms=config["retry_ms"],
                duplicate=bool(duplicate_rate) and rng.random() < duplicate_rate,
                generation=self.generation,
            )
            for _ in range(2 if receipt.duplicate else 1):
                heapq.heappush(self.queue, (due, next(self.order), receipt))
        if self.sender is None:
            self.sender = threading.Thread(
                target=self._send_receipts, name="stub-provider-receipts", daemon=True
            )
            self.sender.start()
        self.receipts_due.notify_all()

    def _next_receipt(self) -> Receipt | None:
        """The next receipt once it is due, or None when the stub is closed."""
        with self.lock:
            while not self.closed:
                timeout: float | None = None
                if self.queue:
                    timeout = self.queue[0][0] - time.monotonic()
                    if timeout <= 0:
                        self.posting += 1
                        return heapq.heappop(self.queue)[2]
                self.receipts_due.wait(timeout)
            return None

    def _send_receipts(self) -> None:
        """The sender thread: POST each receipt when due, one at a time, retrying as configured."""
        while (receipt := self._next_receipt()) is not None:
            timestamp = int(time.time())
            headers = {
                "content-type": JSON,
                "webhook-id": receipt.event,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": sign_receipt(
                    receipt.secret, receipt.event, timestamp, receipt.body
                ),
            }
            answer = post_receipt(receipt.url, headers, receipt.body)
            receipt = receipt._replace(tries=receipt.tries + 1)
            with self.lock:
                self.posting -= 1
                if receipt.generation != self.generation or self.closed:
                    continue
                entry = self.sent.get(receipt.event)
                if entry is None:
                    entry = self.sent[receipt.event] = {
                        "event": receipt.event,
                        "key": receipt.key,
                        "status": receipt.status,
                        "answer": None,
                        "tries": 0,
                        "duplicate": receipt.duplicate,
                    }
                entry["tries"] += 1
                if answer is not None:
                    entry["answer"] = answer
                ok = answer is not None and 200 <= answer < 300
                if not ok and receipt.tries < receipt.max_tries:
                    wait_ms = receipt.retry_ms * 2 ** (receipt.tries - 1)
                    due = time.monotonic() + wait_ms / 1000.0
                    heapq.heappush(self.queue, (due, next(self.order), receipt))
                    self.receipts_due.notify_all()

    def close(self) -> None:
        """Stop the receipts' sender thread (a POST under way ends first) and drop the queue."""
        with self.lock:
            self.closed = True
            self.queue = []
            self.receipts_due.notify_all()
            sender = self.sender
        if sender is not None and sender is not threading.current_thread():
            sender.join(timeout=RECEIPT_TIMEOUT + 1.0)


def post_receipt(url: str, headers: Mapping[str, str], body: bytes) -> int | None:
    """POST one receipt to ``url`` (no proxy, no redirect); its HTTP status, or None when it
    could not connect or got no answer within the timeout."""
    parts = urlsplit(url)
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = connection_class(parts.hostname or "", parts.port, timeout=RECEIPT_TIMEOUT)
    try:
        connection.request("POST", path, body=body, headers=dict(headers))
        response = connection.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
