"""The Twilio adapter against a stub of Twilio's Messages API over real HTTP."""

from __future__ import annotations

import base64
import datetime as dt
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from delivery.pipeline.outcomes import (
    Absent,
    Delivered,
    Found,
    LookupFailed,
    Permanent,
    Retryable,
    Unknown,
)
from delivery.providers import Envelope
from tests.provider_stubs import Reply, TwilioStub, provider_from, twilio_error

SID = "AC0123456789abcdef0123456789abcdef"
TOKEN = "twilio-token-s3cr3t-7f1e"
FROM = "+15005550006"
TO = "+12015550123"


@pytest.fixture
def stub() -> Iterator[TwilioStub]:
    with TwilioStub(SID, TOKEN) as server:
        yield server


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_TWILIO_TOKEN", TOKEN)


def twilio(stub: TwilioStub, **extra: Any) -> Any:
    table = {
        "kind": "twilio",
        "base_url": stub.url,
        "account_sid": SID,
        "auth_token_env": "TEST_TWILIO_TOKEN",
        "from_number": FROM,
        **extra,
    }
    return provider_from(table, timeouts={"connect": 1, "read": 2, "write": 1, "pool": 1})


def sms(body: str = "Your code is 482901", to: str = TO, key: str = "otp-1") -> Envelope:
    return Envelope(key, "sms", to, {"body": body})


def test_send_is_a_form_post_with_basic_auth_and_the_sid_is_the_reference(
    stub: TwilioStub,
) -> None:
    """A send posts To/From/Body form-encoded to the account's Messages.json with basic auth,
    and the new message's sid comes back as the provider reference."""
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    [request] = stub.sent()
    assert request.path == f"/2010-04-01/Accounts/{SID}/Messages.json"
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert request.form() == {"To": TO, "From": FROM, "Body": "Your code is 482901"}
    assert request.headers["authorization"] == (
        "Basic " + base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
    )
    assert "idempotency-key" not in request.headers
    assert outcome == Delivered(stub.messages[0]["sid"], 201)
    assert outcome.provider_ref and outcome.provider_ref.startswith("SM")


def test_messaging_service_sid_replaces_from(stub: TwilioStub) -> None:
    """With messaging_service_sid configured the form carries MessagingServiceSid, not From."""
    table = {
        "kind": "twilio",
        "base_url": stub.url,
        "account_sid": SID,
        "auth_token_env": "TEST_TWILIO_TOKEN",
        "messaging_service_sid": "MG0123",
    }
    provider = provider_from(table)
    assert isinstance(provider.send(sms()), Delivered)
    provider.close()
    assert stub.sent()[0].form() == {
        "To": TO,
        "MessagingServiceSid": "MG0123",
        "Body": sms().payload["body"],
    }


MAPPING = [
    # (answer, outcome class, code, retry_after)
    (
        twilio_error(21211, "The 'To' number +12015550123 is not a valid phone number."),
        Permanent,
        "21211",
        None,
    ),
    (twilio_error(21214, "'To' phone number cannot be reached"), Permanent, "21214", None),
    (twilio_error(21614, "'To' number is not a valid mobile number"), Permanent, "21614", None),
    (twilio_error(21610, "Attempt to send to unsubscribed recipient"), Permanent, "21610", None),
    (
        twilio_error(21408, "Permission to send an SMS has not been enabled for the region"),
        Permanent,
        "21408",
        None,
    ),
    (
        twilio_error(21612, "The 'To' phone number is not currently reachable via SMS"),
        Permanent,
        "21612",
        None,
    ),
    (twilio_error(30005, "Unknown destination handset", 400), Permanent, "30005", None),
    (
        twilio_error(
            21611, "This 'From' number has exceeded the maximum number of queued messages"
        ),
        Retryable,
        "21611",
        None,
    ),
    (twilio_error(21999, "Some other invalid parameter"), Permanent, "21999", None),
    (twilio_error(20404, "The requested resource was not found", 404), Permanent, "20404", None),
    (
        Reply(
            429, twilio_error(20429, "Too Many Requests", 429).json, headers={"Retry-After": "7"}
        ),
        Retryable,
        "20429",
        7.0,
    ),
    # 500/502/504 came after the request was written: the SMS may exist (unknown -> lookup).
    (twilio_error(20500, "Internal Server Error", 500), Unknown, "20500", None),
    (twilio_error(20503, "Service Unavailable", 503), Retryable, "20503", None),
    (
        Reply(502, body="<html>Bad Gateway</html>", content_type="text/html"),
        Unknown,
        "HTTP_502",
        None,
    ),
    (Reply(504, body="Gateway Timeout", content_type="text/plain"), Unknown, "HTTP_504", None),
    (Reply(201, {"status": "queued"}), Unknown, "NO_PROVIDER_REF", None),
]


@pytest.mark.parametrize(("answer", "kind", "code", "retry_after"), MAPPING)
def test_outcome_mapping(
    stub: TwilioStub, answer: Reply, kind: type, code: str, retry_after: float | None
) -> None:
    """Each recorded Twilio answer maps to its outcome: permanent codes dead, 429/503 retry
    (Retry-After honoured), 500/502/504 and a 2xx without a sid unknown."""
    stub.push(answer)
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    assert type(outcome) is kind
    assert outcome.code == code  # type: ignore[union-attr]
    assert outcome.http_status == answer.status
    if kind is Retryable:
        assert outcome.retry_after == retry_after  # type: ignore[union-attr]
    if isinstance(outcome, Permanent) and answer.json:
        assert outcome.reason == answer.json["message"]


def test_wrong_token_is_permanent_20003(stub: TwilioStub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token Twilio rejects (its real 401 answer, code 20003) is permanent."""
    monkeypatch.setenv("TEST_TWILIO_TOKEN", "wrong")
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    assert outcome == Permanent("20003", "Authenticate", 401)
    assert stub.messages == []


def test_missing_token_fails_without_calling_twilio(
    stub: TwilioStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the token's variable unset, the send is permanent NO_CREDENTIALS and nothing is sent."""
    monkeypatch.delenv("TEST_TWILIO_TOKEN")
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    assert isinstance(outcome, Permanent) and outcome.code == "NO_CREDENTIALS"
    assert "TEST_TWILIO_TOKEN" in outcome.reason
    assert stub.requests == []


def test_lost_answer_is_unknown_and_lookup_finds_the_message(stub: TwilioStub) -> None:
    """An answer lost after Twilio created the message is unknown; the lookup then finds that
    message by recipient and body, so the policy marks it sent instead of sending twice."""
    stub.push(Reply(drop=True))
    provider = twilio(stub)
    outcome = provider.send(sms())
    assert isinstance(outcome, Unknown)
    assert len(stub.messages) == 1
    found = provider.lookup(sms())
    provider.close()
    assert found == Found(stub.messages[0]["sid"], 200)
    [query] = stub.sent("GET")
    assert query.query["To"] == [TO] and query.query["From"] == [FROM]
    assert "DateSent>" not in str(query.query)


def test_lookup_is_absent_when_nothing_matches(stub: TwilioStub) -> None:
    """Nothing to that number, another body, or our body outside the window: absent."""
    old = dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)
    stub.add_message(TO, "Your code is 482901", old, FROM)  # same body, outside a 1 h window
    stub.add_message(TO, "Your code is 111111", dt.datetime.now(dt.UTC), FROM)
    stub.add_message("+12015550999", "Your code is 482901", dt.datetime.now(dt.UTC), FROM)
    provider = twilio(stub, lookup_window=3600)
    assert provider.lookup(sms()) == Absent(200)
    assert provider.lookup(sms(to="+12015550777")) == Absent(200)
    provider.close()


def test_lookup_matches_a_trial_account_prefix(stub: TwilioStub) -> None:
    """A trial account's prefixed body still matches ours."""
    message = stub.add_message(
        TO,
        "Sent from your Twilio trial account - Your code is 482901",
        dt.datetime.now(dt.UTC),
        FROM,
    )
    provider = twilio(stub)
    assert provider.lookup(sms()) == Found(message["sid"], 200)
    provider.close()


def test_lookup_follows_pages_and_gives_up_past_its_limit() -> None:
    """The lookup follows next_page_uri to an older message; more pages than lookup_pages
    inside the window is a failed lookup (looked again later), not absent."""
    with TwilioStub(SID, TOKEN, page_size_cap=2) as stub:
        now = dt.datetime.now(dt.UTC)
        ours = stub.add_message(TO, "Your code is 482901", now - dt.timedelta(minutes=9), FROM)
        for i in range(5):
            stub.add_message(TO, f"later {i}", now - dt.timedelta(minutes=5 - i), FROM)
        provider = twilio(stub)
        assert provider.lookup(sms()) == Found(ours["sid"], 200)
        assert len(stub.sent("GET")) == 3
        provider.close()
        short = twilio(stub, lookup_pages=2)
        failed = short.lookup(sms())
        short.close()
        assert isinstance(failed, LookupFailed) and failed.code == "LOOKUP_TOO_MANY"


def test_lookup_failure_is_reported(stub: TwilioStub) -> None:
    """A list query answered 503 is a failed lookup carrying Twilio's code."""
    stub.push(twilio_error(20503, "Service Unavailable", 503), method="GET")
    provider = twilio(stub)
    failed = provider.lookup(sms())
    provider.close()
    assert failed == LookupFailed("20503", "list query: Service Unavailable", 503)


def test_read_timeout_is_unknown_and_refused_connection_is_retryable(stub: TwilioStub) -> None:
    """Per-phase timeouts: an answer slower than the read timeout is unknown (the SMS may
    exist); a refused connection is retryable (nothing was sent)."""
    stub.push(Reply(delay=1.0))
    provider = provider_from(
        {
            "kind": "twilio",
            "base_url": stub.url,
            "account_sid": SID,
            "auth_token_env": "TEST_TWILIO_TOKEN",
            "from_number": FROM,
            "timeouts": {"read": 0.2},
        }
    )
    outcome = provider.send(sms())
    provider.close()
    assert isinstance(outcome, Unknown) and outcome.code == "NETWORK_ReadTimeout"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    provider = provider_from(
        {
            "kind": "twilio",
            "base_url": f"http://127.0.0.1:{closed}",
            "account_sid": SID,
            "auth_token_env": "TEST_TWILIO_TOKEN",
            "from_number": FROM,
        }
    )
    outcome = provider.send(sms())
    provider.close()
    assert isinstance(outcome, Retryable) and outcome.code == "NETWORK_ConnectError"


def test_the_token_is_never_logged(stub: TwilioStub, caplog: pytest.LogCaptureFixture) -> None:
    """Sends, errors and lookups at DEBUG log level never print the auth token, nor do the
    outcomes or the settings' repr."""
    caplog.set_level(logging.DEBUG)
    stub.push(twilio_error(21211, "bad number"), Reply(drop=True))
    provider = twilio(stub)
    outcomes = [
        provider.send(sms()),
        provider.send(sms()),
        provider.send(sms()),
        provider.lookup(sms()),
    ]
    provider.close()
    assert caplog.records, "nothing was logged: the check would prove nothing"
    assert TOKEN not in caplog.text
    assert TOKEN not in repr(outcomes)
    assert TOKEN not in repr(provider.__dict__)
