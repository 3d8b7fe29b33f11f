"""Tests for the stub provider's delivery receipts, POSTed to a tiny receiver in this process."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any, NamedTuple

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from delivery.testing.stub_provider import StubClient, StubServer
from tests.provider_stubs import QuietHTTPServer

TO = "+15551234567"
SECRET = "whsec_" + base64.b64encode(b"receipts-test-key-0123456789abcd").decode()


class Received(NamedTuple):
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival

    @property
    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.body)
        return doc


class _Server(QuietHTTPServer):
    def server_bind(self) -> None:  # no reverse DNS lookup
        socketserver.TCPServer.server_bind(self)


class Receiver:
    """Records every POST and answers the statuses in ``answers`` in turn, then 200."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.answers: list[int] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {name.lower(): value for name, value in self.headers.items()}
                with receiver.lock:
                    receiver.received.append(Received(headers, body, time.monotonic()))
                    status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/receipts"

    def wait(self, count: int, timeout: float = 1.5) -> list[Received]:
        """The first ``count`` requests, once that many have arrived (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return list(self.received[:count])
            time.sleep(0.005)
        raise AssertionError(f"expected {count} receipts, got {len(self.received)}")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer().start() as server:
        yield server


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def http(stub: StubServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stub.url, timeout=10.0) as client:
        yield client


def send(http: httpx.Client, key: str, to: str = TO) -> httpx.Response:
    body = json.dumps({"to": to, "body": "hello"})
    return http.post("/v1/messages", content=body, headers={"Idempotency-Key": key})


def configure(stub: StubServer, receiver: Receiver, **knobs: Any) -> dict[str, Any]:
    return stub.set_receipts(url=receiver.url, secret=SECRET, **knobs)


def wait_sent(stub: StubServer, done: Any, timeout: float = 1.5) -> list[dict[str, Any]]:
    """The receipts' log once ``done(log)`` is true (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sent: list[dict[str, Any]] = stub.receipts()["sent"]
        if done(sent):
            return sent
        time.sleep(0.005)
    raise AssertionError(f"receipts log never done: {stub.receipts()['sent']}")


def parse_at(at: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", at), at
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ")


def test_default_sequence_is_sent_then_delivered_and_verifies(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """One message gets "sent" then "delivered" receipts, signed so standardwebhooks verifies."""
    configure(stub, receiver)
    msg_id = send(http, "k1").json()["id"]
    got = receiver.wait(2)
    webhook = Webhook(SECRET)
    for receipt in got:
        assert webhook.verify(receipt.body, receipt.headers) == receipt.doc
        assert receipt.headers["content-type"] == "application/json"
        assert re.fullmatch(r"evt_[0-9a-f]{24}", receipt.headers["webhook-id"])
        assert abs(int(receipt.headers["webhook-timestamp"]) - time.time()) < 5
        assert receipt.body == json.dumps(receipt.doc, separators=(",", ":")).encode()
    docs = [receipt.doc for receipt in got]
    assert [set(doc) for doc in docs] == [{"id", "idempotency_key", "status", "code", "at"}] * 2
    assert [(d["id"], d["idempotency_key"], d["status"], d["code"]) for d in docs] == [
        (msg_id, "k1", "sent", None),
        (msg_id, "k1", "delivered", None),
    ]
    assert parse_at(docs[0]["at"]) < parse_at(docs[1]["at"])
    assert got[0].headers["webhook-id"] != got[1].headers["webhook-id"]
    sent = wait_sent(stub, lambda log: len(log) == 2)
    assert sent == [
        {
            "event": receipt.headers["webhook-id"],
            "key": "k1",
            "status": receipt.doc["status"],
            "answer": 200,
            "tries": 1,
            "duplicate": False,
        }
        for receipt in got
    ]


def test_rule_makes_the_final_status_undelivered_with_its_code(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """A recipient's rule ends its sequence with "undelivered" and the code on that receipt only."""
    configure(stub, receiver, rules={TO: {"status": "undelivered", "code": "30003"}})
    send(http, "k1")
    docs = [receipt.doc for receipt in receiver.wait(2)]
    assert [(doc["status"], doc["code"]) for doc in docs] == [
        ("sent", None),
        ("undelivered", "30003"),
    ]


def test_delay_ms_delays_receipts_but_not_the_answer(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """delay_ms=200 holds the receipts back 200 ms while the POST is answered at once."""
    configure(stub, receiver, delay_ms=200)
    start = time.monotonic()
    assert send(http, "k1").status_code == 201
    assert time.monotonic() - start < 0.15
    got = receiver.wait(2)
    assert got[0].at - start >= 0.2


def test_duplicate_rate_one_sends_each_event_twice_with_its_webhook_id(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """duplicate_rate=1 POSTs every event twice, both times with the same webhook-id."""
    configure(stub, receiver, duplicate_rate=1.0)
    send(http, "k1")
    got = receiver.wait(4)
    ids = [receipt.headers["webhook-id"] for receipt in got]
    assert ids[0] == ids[1] != ids[2] == ids[3]
    assert got[0].body == got[1].body and got[2].body == got[3].body
    for receipt in got:
        Webhook(SECRET).verify(receipt.body, receipt.headers)
    sent = wait_sent(stub, lambda log: [entry["tries"] for entry in log] == [2, 2])
    assert [(entry["event"], entry["duplicate"]) for entry in sent] == [
        (ids[0], True),
        (ids[2], True),
    ]


def test_reorder_sends_delivered_first_with_at_in_event_order(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """reorder=true POSTs "delivered" before "sent", yet "sent" keeps the earlier "at"."""
    configure(stub, receiver, reorder=True)
    send(http, "k1")
    first, second = (receipt.doc for receipt in receiver.wait(2))
    assert [first["status"], second["status"]] == ["delivered", "sent"]
    assert parse_at(second["at"]) < parse_at(first["at"])


def test_never_rate_one_sends_no_receipt(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """never_rate=1 sends nothing for a message: a later message's receipts are the only ones."""
    configure(stub, receiver, never_rate=1.0)
    send(http, "lost-1")
    send(http, "lost-2")
    stub.set_receipts(never_rate=0.0)
    send(http, "marker")
    time.sleep(0.05)
    got = receiver.wait(2)
    assert [receipt.doc["idempotency_key"] for receipt in receiver.received] == ["marker"] * 2
    assert [entry["key"] for entry in stub.receipts()["sent"]] == ["marker"] * 2
    assert len(got) == 2


def test_non_2xx_answers_are_retried_until_2xx(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """A receiver answering 503, 503 then 200 gets 3 tries; the log says tries=3, answer=200."""
    configure(stub, receiver, statuses=["delivered"], retry_ms=10)
    receiver.answers = [503, 503]
    send(http, "k1")
    got = receiver.wait(3)
    assert len({receipt.headers["webhook-id"] for receipt in got}) == 1
    assert got[2].at - got[1].at >= 0.02 - 0.005  # retry_ms doubles: 10 ms, then 20 ms
    sent = wait_sent(stub, lambda log: log and log[0]["answer"] == 200)
    assert sent == [
        {
            "event": got[0].headers["webhook-id"],
            "key": "k1",
            "status": "delivered",
            "answer": 200,
            "tries": 3,
            "duplicate": False,
        }
    ]


def test_unreachable_url_is_tried_max_tries_times(stub: StubServer, http: httpx.Client) -> None:
    """A refused connection counts as a failed try; after max_tries the log has answer null."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stub.set_receipts(
        url=f"http://127.0.0.1:{port}/", secret=SECRET, statuses=["sent"], max_tries=2, retry_ms=5
    )
    send(http, "k1")
    sent = wait_sent(stub, lambda log: log and log[0]["tries"] == 2)
    time.sleep(0.05)
    assert stub.receipts()["sent"] == [
        {
            "event": sent[0]["event"],
            "key": "k1",
            "status": "sent",
            "answer": None,
            "tries": 2,
            "duplicate": False,
        }
    ]


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"duplicate_rate": 2}, "duplicate_rate"),
        ({"never_rate": "1"}, "never_rate"),
        ({"delay_ms": -1}, "delay_ms"),
        ({"max_tries": 0}, "max_tries"),
        ({"retry_ms": 1.5}, "retry_ms"),
        ({"reorder": 1}, "reorder"),
        ({"statuses": []}, "statuses"),
        ({"url": "ftp://127.0.0.1/"}, "url"),
        ({"url": "http://127.0.0.1:1/"}, "secret"),
        ({"secret": "not-a-secret"}, "secret"),
        ({"rules": {TO: {"status": "lost"}}}, "rules"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_knob_is_400_naming_it(http: httpx.Client, knobs: dict[str, Any], field: str) -> None:
    """An unknown or invalid receipts knob is refused with 400 and a message naming it."""
    response = http.put("/_stub/receipts", json=knobs)
    assert response.status_code == 400
    assert response.json()["code"] == "INVALID_RECEIPTS"
    assert field in response.json()["message"]
    assert http.get("/_stub/receipts").json()["config"]["url"] is None


def test_put_merges_and_get_shows_config_and_log(http: httpx.Client) -> None:
    """PUT merges a partial dict and returns the whole config; GET shows it with the log."""
    config = http.put("/_stub/receipts", json={"delay_ms": 5}).json()
    assert config["delay_ms"] == 5 and config["statuses"] == ["sent", "delivered"]
    config = http.put("/_stub/receipts", json={"reorder": True}).json()
    assert config["delay_ms"] == 5 and config["reorder"] is True
    assert http.get("/_stub/receipts").json() == {"config": config, "sent": [], "queued": 0}


def test_reset_clears_config_log_and_queued_receipts(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """POST /_stub/reset restores the defaults, clears the log and drops receipts not yet sent."""
    configure(stub, receiver)
    send(http, "k1")
    receiver.wait(2)
    wait_sent(stub, lambda log: len(log) == 2)
    stub.set_receipts(delay_ms=150, reorder=True)
    send(http, "k2")
    assert http.post("/_stub/reset").status_code == 200
    receipts = http.get("/_stub/receipts").json()
    assert receipts["sent"] == []
    assert receipts["config"] == {
        "url": None,
        "secret": None,
        "statuses": ["sent", "delivered"],
        "rules": {},
        "delay_ms": 0,
        "duplicate_rate": 0.0,
        "reorder": False,
        "never_rate": 0.0,
        "seed": None,
        "max_tries": 5,
        "retry_ms": 200,
    }
    time.sleep(0.25)
    assert len(receiver.received) == 2
    assert stub.receipts()["sent"] == []


def test_replays_send_no_more_receipts(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """A deduped replay of a key records no effect, so it sends no receipt of its own."""
    configure(stub, receiver)
    first = send(http, "k1")
    replay = send(http, "k1")
    assert replay.content == first.content
    send(http, "marker")
    receiver.wait(4)
    time.sleep(0.05)
    keys = [receipt.doc["idempotency_key"] for receipt in receiver.received]
    assert keys == ["k1", "k1", "marker", "marker"]


def test_dropped_answer_still_sends_receipts(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """A drop records the effect, so its receipts go out although the client saw no answer."""
    configure(stub, receiver)
    stub.set_faults(drop_rate=1.0)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        send(http, "k1")
    assert [receipt.doc["status"] for receipt in receiver.wait(2)] == ["sent", "delivered"]


def test_no_recipient_or_secret_in_get_receipts(
    stub: StubServer, receiver: Receiver, http: httpx.Client
) -> None:
    """GET /_stub/receipts shows no recipient, no body and no secret, even with a rule."""
    configure(stub, receiver, rules={TO: {"status": "undelivered", "code": "30003"}})
    msg_id = send(http, "k1").json()["id"]
    receiver.wait(2)
    wait_sent(stub, lambda log: len(log) == 2)
    text = http.get("/_stub/receipts").text
    for secret in (TO, msg_id, SECRET, SECRET.removeprefix("whsec_")):
        assert secret not in text
    config = json.loads(text)["config"]
    assert config["secret"] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert list(config["rules"]) == [hashlib.sha256(TO.encode()).hexdigest()]


def test_stub_client_sets_and_reads_receipts(stub: StubServer, receiver: Receiver) -> None:
    """StubClient.set_receipts and receipts work over HTTP; a bad knob raises ValueError."""
    with StubClient(stub.url) as control, httpx.Client(base_url=stub.url) as http:
        config = control.set_receipts(url=receiver.url, secret=SECRET, statuses=["delivered"])
        assert config["url"] == receiver.url
        send(http, "k1")
        receiver.wait(1)
        sent = wait_sent(stub, lambda log: len(log) == 1)
        assert control.receipts() == {"config": config, "sent": sent, "queued": 0}
        with pytest.raises(ValueError, match="duplicate_rate"):
            control.set_receipts(duplicate_rate=-1)


def test_stop_ends_the_sender_thread(receiver: Receiver) -> None:
    """StubServer.stop() ends the receipts' sender thread."""
    before = set(threading.enumerate())
    with StubServer().start() as stub, httpx.Client(base_url=stub.url) as http:
        configure(stub, receiver, delay_ms=1000)
        send(http, "k1")
        senders = [
            thread
            for thread in set(threading.enumerate()) - before
            if thread.name == "stub-provider-receipts"
        ]
        assert len(senders) == 1
    senders[0].join(timeout=1.0)
    assert not senders[0].is_alive()
    assert receiver.received == []
