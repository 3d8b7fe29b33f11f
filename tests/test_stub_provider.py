"""Tests for the fault-injecting stub provider, run in a thread on an ephemeral port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.testing.stub_provider import StubClient, StubServer

REPO_ROOT = Path(__file__).resolve().parents[1]
TO = "+15551234567"


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer().start() as server:
        yield server


@pytest.fixture
def http(stub: StubServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stub.url, timeout=10.0) as client:
        yield client


def send(http: httpx.Client, key: str | None, body: dict[str, Any] | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    payload = body if body is not None else {"to": TO, "body": "hello"}
    return http.post("/v1/messages", content=json.dumps(payload), headers=headers)


def test_post_returns_201_with_id_and_records_one_effect(
    stub: StubServer, http: httpx.Client
) -> None:
    """A first POST is accepted with a msg_ id and counts exactly one effect for its key."""
    response = send(http, "k1")
    assert response.status_code == 201
    doc = response.json()
    assert doc["id"].startswith("msg_") and len(doc["id"]) > len("msg_")
    assert doc == {"id": doc["id"], "to": TO, "status": "accepted"}
    assert stub.effects() == {"k1": 1}


def test_post_without_key_counts_under_empty_key(stub: StubServer, http: httpx.Client) -> None:
    """Keyless POSTs are never deduped and each counts as an effect under the key ""."""
    assert send(http, None).status_code == 201
    assert send(http, None).status_code == 201
    assert stub.effects() == {"": 2}


def test_invalid_json_or_missing_to_is_400(stub: StubServer, http: httpx.Client) -> None:
    """Unparseable JSON and a body without "to" get 400 INVALID_REQUEST and no effect."""
    bad_json = http.post("/v1/messages", content=b"{not json", headers={"Idempotency-Key": "a"})
    no_to = send(http, "b", {"body": "hello"})
    for response in (bad_json, no_to):
        assert response.status_code == 400
        assert response.json()["code"] == "INVALID_REQUEST"
    assert stub.effects() == {}


def test_same_key_same_body_replays_byte_for_byte(stub: StubServer, http: httpx.Client) -> None:
    """Repeating key and body returns the stored status and bytes without a second effect."""
    first = send(http, "k1")
    second = send(http, "k1")
    assert second.status_code == first.status_code == 201
    assert second.content == first.content
    assert stub.effects() == {"k1": 1}
    assert [r["outcome"] for r in stub.requests()] == ["effect", "replay"]


def test_same_key_other_body_is_422(stub: StubServer, http: httpx.Client) -> None:
    """Reusing a key with a different body is refused with IDEMPOTENCY_KEY_REUSED."""
    send(http, "k1", {"to": TO, "body": "one"})
    response = send(http, "k1", {"to": TO, "body": "two"})
    assert response.status_code == 422
    assert response.json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert stub.effects() == {"k1": 1}


def test_same_key_in_flight_is_409(stub: StubServer) -> None:
    """While a keyed request is held by delay_ms, a second one with that key gets 409."""
    stub.set_faults(delay_ms=1500)
    statuses: list[int] = []

    def post() -> None:
        with httpx.Client(base_url=stub.url, timeout=10.0) as client:
            statuses.append(send(client, "slow").status_code)

    first = threading.Thread(target=post)
    first.start()
    time.sleep(0.3)
    post()
    first.join()
    # Whichever arrived first won; the other one must have seen the key in flight.
    assert sorted(statuses) == [201, 409]
    conflict = next(r for r in stub.requests() if r["status"] == 409)
    assert conflict["outcome"] == "rejected"
    assert stub.effects() == {"slow": 1}


def test_lookup_finds_stored_message_or_404(http: httpx.Client) -> None:
    """Lookup by idempotency key returns the 201 body for a known key and 404 otherwise."""
    created = send(http, "k1").json()
    found = http.get("/v1/messages", params={"idempotency_key": "k1"})
    assert found.status_code == 200
    assert found.json() == created
    missing = http.get("/v1/messages", params={"idempotency_key": "nope"})
    assert missing.status_code == 404
    assert missing.json() == {"code": "NOT_FOUND"}


def test_dedupe_off_gives_two_effects_but_lookup_still_works(
    stub: StubServer, http: httpx.Client
) -> None:
    """With dedupe off the same key sends twice, and lookup returns the latest message."""
    stub.set_faults(dedupe=False)
    first = send(http, "k1")
    second = send(http, "k1")
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] != second.json()["id"]
    assert stub.effects() == {"k1": 2}
    found = http.get("/v1/messages", params={"idempotency_key": "k1"})
    assert found.status_code == 200
    assert found.json() == second.json()


def test_drop_records_effect_but_client_sees_disconnect(
    stub: StubServer, http: httpx.Client
) -> None:
    """drop_rate=1 closes the connection unanswered after the effect, which a retry replays."""
    stub.set_faults(drop_rate=1.0)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        send(http, "k1")
    assert stub.effects() == {"k1": 1}
    assert stub.requests()[0]["outcome"] == "dropped"
    stored = http.get("/v1/messages", params={"idempotency_key": "k1"})
    assert stored.status_code == 200
    stub.set_faults(drop_rate=0.0)
    retry = send(http, "k1")
    assert retry.status_code == 201
    assert retry.json() == stored.json()
    assert stub.effects() == {"k1": 1}


def test_error_503_is_html_with_retry_after(stub: StubServer, http: httpx.Client) -> None:
    """error_rate=1 with the default 503 answers an HTML page with Retry-After and no effect."""
    stub.set_faults(error_rate=1.0, retry_after=7)
    response = send(http, "k1")
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["retry-after"] == "7"
    assert "<html" in response.text
    assert stub.effects() == {}
    assert stub.requests()[0]["outcome"] == "error"


def test_error_429_is_json_with_retry_after(stub: StubServer, http: httpx.Client) -> None:
    """error_status=429 answers JSON RATE_LIMITED with Retry-After and records no effect."""
    stub.set_faults(error_rate=1.0, error_status=429, retry_after=2)
    response = send(http, "k1")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"
    assert response.json() == {"code": "RATE_LIMITED"}
    assert stub.effects() == {}


def test_error_other_status_or_no_html_is_json_provider_error(
    stub: StubServer, http: httpx.Client
) -> None:
    """A 503 with error_html off, or a 500, is JSON PROVIDER_ERROR without Retry-After."""
    stub.set_faults(error_rate=1.0, error_html=False)
    response = send(http, "k1")
    assert response.status_code == 503
    assert response.json() == {"code": "PROVIDER_ERROR"}
    assert "retry-after" not in response.headers
    stub.set_faults(error_status=500)
    assert send(http, "k1").status_code == 500


def test_fail_first_fails_n_times_per_key_then_succeeds(
    stub: StubServer, http: httpx.Client
) -> None:
    """fail_first=2 makes each key's first two POSTs fail and the third one take effect."""
    stub.set_faults(fail_first=2, error_html=False)
    assert [send(http, "k1").status_code for _ in range(3)] == [503, 503, 201]
    assert send(http, "k2").status_code == 503
    assert stub.effects() == {"k1": 1}


def test_down_answers_every_post_and_lookup_with_the_error_and_keeps_what_it_holds(
    stub: StubServer, http: httpx.Client
) -> None:
    """down=true: a provider that is down. A new key, a key whose answer would replay and a
    lookup all get error_status, no effect; once up again the replay and the lookup answer as
    before (what it held was kept)."""
    first = send(http, "k1")
    assert first.status_code == 201
    stub.set_faults(down=True, retry_after=3)
    replay, new = send(http, "k1"), send(http, "k2")
    found = http.get("/v1/messages", params={"idempotency_key": "k1"})
    for response in (replay, new, found):
        assert response.status_code == 503
        assert response.headers["retry-after"] == "3"
    assert stub.effects() == {"k1": 1}
    assert [r["outcome"] for r in stub.requests()] == ["effect", "error", "error"]
    stub.set_faults(down=False)
    assert send(http, "k1").content == first.content
    assert http.get("/v1/messages", params={"idempotency_key": "k1"}).status_code == 200
    assert http.get("/v1/messages", params={"idempotency_key": "k2"}).status_code == 404
    assert stub.effects() == {"k1": 1}
    with pytest.raises(ValueError, match="down"):
        stub.set_faults(down="yes")


def test_error_rate_is_reproducible_with_seed(stub: StubServer, http: httpx.Client) -> None:
    """The same seed and error_rate give the same sequence of errors and successes."""

    def run() -> list[int]:
        stub.reset()
        stub.set_faults(error_rate=0.5, seed=1234)
        return [send(http, f"k{i}").status_code for i in range(30)]

    first = run()
    assert first == run()
    assert {201, 503} == set(first)


def test_rule_for_recipient_returns_its_answer_without_effect(
    stub: StubServer, http: httpx.Client
) -> None:
    """A rule makes a recipient always get the configured 400 body and records no effect."""
    bad = "+15005550001"
    stub.set_faults(rules={bad: {"status": 400, "json": {"code": 21211, "message": "Invalid To"}}})
    for _ in range(2):
        response = send(http, "k1", {"to": bad, "body": "hello"})
        assert response.status_code == 400
        assert response.json() == {"code": 21211, "message": "Invalid To"}
    assert stub.effects() == {}
    assert send(http, "k2").status_code == 201


def test_2xx_rule_answers_raw_body_and_records_effect(stub: StubServer, http: httpx.Client) -> None:
    """A 2xx rule with a raw body answers it verbatim and does record an effect."""
    odd = "+15005550006"
    stub.set_faults(rules={odd: {"status": 200, "body": "OK", "content_type": "text/plain"}})
    response = send(http, "k1", {"to": odd})
    assert response.status_code == 200
    assert response.text == "OK"
    assert response.headers["content-type"] == "text/plain"
    assert stub.effects() == {"k1": 1}
    assert http.get("/v1/messages", params={"idempotency_key": "k1"}).json()["to"] == odd


def test_unknown_fault_field_is_rejected_by_name(stub: StubServer, http: httpx.Client) -> None:
    """An unknown fault field is a 400 naming it over HTTP and a ValueError in-process."""
    response = http.put("/_stub/faults", json={"drop_rate": 0.5, "bogus_knob": 1})
    assert response.status_code == 400
    assert "bogus_knob" in response.json()["message"]
    assert http.get("/_stub/faults").json()["drop_rate"] == 0.0
    with pytest.raises(ValueError, match="bogus_knob"):
        stub.set_faults(bogus_knob=1)


def test_put_faults_merges_and_returns_full_dict(http: httpx.Client) -> None:
    """PUT /_stub/faults merges a partial dict and returns every fault field."""
    http.put("/_stub/faults", json={"delay_ms": 5})
    faults = http.put("/_stub/faults", json={"error_status": 429}).json()
    assert faults["delay_ms"] == 5
    assert faults["error_status"] == 429
    assert faults["dedupe"] is True
    assert http.get("/_stub/faults").json() == faults


def test_requests_log_keeps_order_and_omits_payload(stub: StubServer, http: httpx.Client) -> None:
    """The request log lists every POST in order with key, to, status and outcome, no payload."""
    send(http, "k1", {"to": TO, "body": "secret-text"})
    send(http, "k1", {"to": TO, "body": "secret-text"})
    send(http, "k1", {"to": TO, "body": "other"})
    log = http.get("/_stub/requests").json()["requests"]
    assert [(r["key"], r["to"], r["status"], r["outcome"]) for r in log] == [
        ("k1", TO, 201, "effect"),
        ("k1", TO, 201, "replay"),
        ("k1", TO, 422, "rejected"),
    ]
    assert all(isinstance(r["at"], float) for r in log)
    assert log[0]["at"] <= log[1]["at"] <= log[2]["at"]
    assert "secret-text" not in json.dumps(log)


def test_reset_clears_faults_effects_messages_and_log(stub: StubServer, http: httpx.Client) -> None:
    """POST /_stub/reset restores default faults and forgets effects, messages and the log."""
    send(http, "k1")
    stub.set_faults(error_rate=1.0)
    assert http.post("/_stub/reset").status_code == 200
    assert http.get("/_stub/effects").json() == {"effects": {}, "total": 0}
    assert http.get("/_stub/requests").json() == {"requests": []}
    assert http.get("/_stub/faults").json()["error_rate"] == 0.0
    assert http.get("/v1/messages", params={"idempotency_key": "k1"}).status_code == 404
    assert send(http, "k1").status_code == 201


def test_stub_client_drives_the_stub_over_http(stub: StubServer) -> None:
    """StubClient sets faults, reads effects and requests, resets and checks health over HTTP."""
    with StubClient(stub.url) as control, httpx.Client(base_url=stub.url) as http:
        assert control.health() is True
        assert control.set_faults(fail_first=1)["fail_first"] == 1
        assert send(http, "k1").status_code == 503
        assert send(http, "k1").status_code == 201
        assert control.effects() == {"k1": 1}
        assert [r["outcome"] for r in control.requests()] == ["error", "effect"]
        with pytest.raises(ValueError, match="nope"):
            control.set_faults(nope=True)
        control.reset()
        assert control.effects() == {}
        assert control.faults()["fail_first"] == 0
    assert StubClient("http://127.0.0.1:1").health() is False


def test_health_endpoint(http: httpx.Client) -> None:
    """GET /_stub/health answers 200 {"ok": true}."""
    response = http.get("/_stub/health")
    assert response.status_code == 200
    assert response.json() == {"ok": True}


def test_2000_sequential_keep_alive_requests_succeed(stub: StubServer, http: httpx.Client) -> None:
    """One keep-alive client can push 2,000 sequential POSTs through without a failure."""
    statuses = [send(http, f"cap-{i}").status_code for i in range(2000)]
    assert statuses == [201] * 2000
    assert sum(stub.effects().values()) == 2000


def test_stop_releases_the_port() -> None:
    """After stop() the port no longer accepts connections, even with a keep-alive open."""
    stub = StubServer().start()
    with httpx.Client(base_url=stub.url) as http:
        assert http.get("/_stub/health").status_code == 200
        stub.stop()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{stub.url}/_stub/health", timeout=2.0)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_cli_prints_real_port_and_exits_cleanly_on_signal(signum: signal.Signals) -> None:
    """`python -m delivery.testing.stub_provider --port 0` prints its URL, serves, exits 0 on
    signal."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "delivery.testing.stub_provider", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        prefix = "stub provider listening on "
        assert line.startswith(prefix)
        url = line[len(prefix) :]
        assert not url.endswith(":0")
        assert StubClient(url).health() is True
        proc.send_signal(signum)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
