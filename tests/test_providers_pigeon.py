"""The pigeon adapter against a stub of pigeon's /api/send-email over real HTTP."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from delivery.core.outcomes import (
    Delivered,
    LookupFailed,
    Outcome,
    Permanent,
    Retryable,
    Unknown,
)
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError
from delivery.providers import Envelope
from tests.conftest import wait_until
from tests.provider_stubs import (
    PIGEON_503_HTML,
    PigeonStub,
    Reply,
    pigeon_error,
    provider_from,
    settings_with,
)

KEY = "pigeon-key-s3cr3t-91c4"
TO = "ann@example.com"


@pytest.fixture
def stub() -> Iterator[PigeonStub]:
    with PigeonStub(KEY) as server:
        yield server


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PIGEON_KEY", KEY)


def pigeon(stub: PigeonStub, **extra: Any) -> Any:
    table = {"kind": "pigeon", "base_url": stub.url, "api_key_env": "TEST_PIGEON_KEY", **extra}
    return provider_from(table)


def email(key: str = "receipt-42") -> Envelope:
    payload = {
        "subject": "Your receipt",
        "template": {"id": 7, "data": {"name": "Ann"}},
        "replyTo": "shop@example.com",
    }
    return Envelope(key, "email", TO, payload)


def test_send_has_bearer_key_idempotency_key_and_returns_the_email_id(stub: PigeonStub) -> None:
    """A send posts pigeon's JSON with the bearer key and our key as Idempotency-Key, and
    pigeon's emailId is the provider reference."""
    provider = pigeon(stub)
    outcome = provider.send(email())
    provider.close()
    [request] = stub.sent()
    assert request.path == "/api/send-email"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["idempotency-key"] == "receipt-42"
    assert request.json() == {
        "to": TO,
        "subject": "Your receipt",
        "templateId": 7,
        "templateData": {"name": "Ann"},
        "replyTo": "shop@example.com",
    }
    assert outcome == Delivered("1001", 200)


def test_same_key_twice_is_one_email_with_one_id(stub: PigeonStub) -> None:
    """Sending again with the same key returns the first emailId and sends no second email."""
    provider = pigeon(stub)
    first, second = provider.send(email()), provider.send(email())
    provider.close()
    assert first == second == Delivered("1001", 200)
    assert stub.effects == {"receipt-42": 1}


MAPPING = [
    # (answer, outcome class, code, retry_after)
    (
        Reply(
            429,
            {"error": "Too many requests", "code": "RATE_LIMITED"},
            headers={"Retry-After": "3"},
        ),
        Retryable,
        "RATE_LIMITED",
        3.0,
    ),
    (Reply(503, body=PIGEON_503_HTML, content_type="text/html"), Retryable, "HTTP_503", None),
    (Reply(504, body="upstream timed out", content_type="text/plain"), Retryable, "HTTP_504", None),
    (
        pigeon_error(502, "SMTP_DELIVERY_FAILED", "The SMTP server did not take the message"),
        Retryable,
        "SMTP_DELIVERY_FAILED",
        None,
    ),
    (
        pigeon_error(502, "SMTP_DELIVERY_REJECTED", "Recipient address rejected"),
        Permanent,
        "SMTP_DELIVERY_REJECTED",
        None,
    ),
    (
        Reply(502, body="<html>Bad Gateway</html>", content_type="text/html"),
        Permanent,
        "HTTP_502",
        None,
    ),
    (
        pigeon_error(409, "IDEMPOTENCY_IN_PROGRESS", "A request with this key is in progress"),
        Retryable,
        "IDEMPOTENCY_IN_PROGRESS",
        None,
    ),
    (pigeon_error(409, "CONFLICT", "Something else"), Permanent, "CONFLICT", None),
    (
        pigeon_error(400, "VALIDATION_ERROR", "Missing fields: subject"),
        Permanent,
        "VALIDATION_ERROR",
        None,
    ),
    (pigeon_error(500, "INTERNAL_ERROR", "Unexpected error"), Permanent, "INTERNAL_ERROR", None),
    (Reply(408, body="timeout", content_type="text/plain"), Permanent, "HTTP_408", None),
    (Reply(200, {"ok": True}), Unknown, "NO_PROVIDER_REF", None),
]


@pytest.mark.parametrize(("answer", "kind", "code", "retry_after"), MAPPING)
def test_outcome_mapping(
    stub: PigeonStub, answer: Reply, kind: type, code: str, retry_after: float | None
) -> None:
    """Pigeon's answers map as its reference client decides: 429, 503 (HTML), 504, 502 only
    with SMTP_DELIVERY_FAILED and 409 only with IDEMPOTENCY_IN_PROGRESS retry; the rest is
    final."""
    stub.push(answer)
    provider = pigeon(stub)
    outcome = provider.send(email())
    provider.close()
    assert type(outcome) is kind
    assert outcome.code == code  # type: ignore[union-attr]
    assert outcome.http_status == answer.status
    if kind is Retryable:
        assert outcome.retry_after == retry_after  # type: ignore[union-attr]
    if answer.json and "error" in answer.json:
        assert outcome.reason == answer.json["error"]  # type: ignore[union-attr]
    if answer.body == PIGEON_503_HTML:
        assert "non-JSON" in outcome.reason  # type: ignore[union-attr]


def test_wrong_key_is_final(stub: PigeonStub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key pigeon refuses (401) is final: three attempts would be the same error three times."""
    monkeypatch.setenv("TEST_PIGEON_KEY", "wrong")
    provider = pigeon(stub)
    outcome = provider.send(email())
    provider.close()
    assert outcome == Permanent("UNAUTHORIZED", "Invalid or missing API key", 401)


def test_concurrent_attempt_with_the_same_key_is_told_to_come_back(stub: PigeonStub) -> None:
    """While our first attempt is still talking to SMTP, a second with the same key gets 409
    IDEMPOTENCY_IN_PROGRESS (retryable); afterwards the key returns the one emailId."""
    stub.smtp_seconds = 0.5
    provider = pigeon(stub)
    results: list[Outcome] = []
    first = threading.Thread(target=lambda: results.append(provider.send(email())))
    first.start()
    while not stub.sent():
        threading.Event().wait(0.01)
    second = provider.send(email())
    first.join()
    third = provider.send(email())
    provider.close()
    assert isinstance(second, Retryable) and second.code == "IDEMPOTENCY_IN_PROGRESS"
    assert results == [Delivered("1001", 200)] and third == Delivered("1001", 200)
    assert stub.effects == {"receipt-42": 1}


def test_read_timeout_defaults_above_the_smtp_budget(stub: PigeonStub) -> None:
    """Pigeon's read timeout defaults to 45 s even when [timeouts] says 0.3 s, so a slow SMTP
    conversation (1 s here) is delivered instead of cut off."""
    table = {"kind": "pigeon", "base_url": stub.url, "api_key_env": "TEST_PIGEON_KEY"}
    settings = settings_with({"mail": table}, timeouts={"read": 0.3, "connect": 0.5})
    assert settings.providers["mail"].timeouts.read == 45.0
    assert settings.providers["mail"].timeouts.connect == 0.5
    stub.smtp_seconds = 1.0
    provider = provider_from(table, timeouts={"read": 0.3})
    outcome = provider.send(email())
    provider.close()
    assert outcome == Delivered("1001", 200)


def test_configured_read_timeout_wins_and_a_retry_with_the_key_is_safe(stub: PigeonStub) -> None:
    """An explicit read timeout below the SMTP time makes the attempt unknown although pigeon
    sent the email; the retry with the same key returns that email's id: one email."""
    stub.smtp_seconds = 0.6
    provider = pigeon(stub, timeouts={"read": 0.2})
    first = provider.send(email())
    wait_until(lambda: stub.effects.get("receipt-42") == 1, timeout=5, every=0.02)
    second = provider.send(email())
    provider.close()
    assert isinstance(first, Unknown) and first.code == "NETWORK_ReadTimeout"
    assert second == Delivered("1001", 200)
    assert stub.effects == {"receipt-42": 1}


def test_no_lookup_and_retry_is_the_default_policy(stub: PigeonStub) -> None:
    """Pigeon has no lookup: lookup answers NO_LOOKUP, a channel on it defaults to retry, and
    on_unknown = "lookup" on such a channel is a config error naming the key."""
    provider = pigeon(stub)
    assert provider.lookup(email()) == LookupFailed(
        "NO_LOOKUP", "pigeon has no lookup; use on_unknown = 'retry'"
    )
    provider.close()
    table = {"kind": "pigeon", "base_url": stub.url, "api_key_env": "TEST_PIGEON_KEY"}
    settings = settings_with({"mail": table}, {"email": {"provider": "mail"}})
    assert settings.channels["email"].on_unknown is UnknownPolicy.RETRY
    with pytest.raises(ConfigError) as err:
        settings_with({"mail": table}, {"email": {"provider": "mail", "on_unknown": "lookup"}})
    assert err.value.key == "channels.email.on_unknown"


def test_api_key_env_is_required(stub: PigeonStub) -> None:
    """A pigeon provider without api_key_env fails at start-up, naming the key."""
    with pytest.raises(ConfigError) as err:
        settings_with({"mail": {"kind": "pigeon", "base_url": stub.url}})
    assert err.value.key == "providers.mail.api_key_env"


def test_missing_key_fails_without_calling_pigeon(
    stub: PigeonStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the key's variable unset nothing is sent and the outcome names the variable."""
    monkeypatch.delenv("TEST_PIGEON_KEY")
    provider = pigeon(stub)
    outcome = provider.send(email())
    provider.close()
    assert isinstance(outcome, Permanent) and outcome.code == "NO_CREDENTIALS"
    assert stub.requests == []


def test_the_key_is_never_logged(stub: PigeonStub, caplog: pytest.LogCaptureFixture) -> None:
    """Sends and errors at DEBUG log level never print the bearer key, nor do the outcomes."""
    caplog.set_level(logging.DEBUG)
    stub.push(pigeon_error(502, "SMTP_DELIVERY_REJECTED", "rejected"), Reply(drop=True))
    provider = pigeon(stub, timeouts={"read": 1})  # also logs the below-budget warning
    outcomes = [provider.send(email()), provider.send(email()), provider.send(email())]
    provider.close()
    assert "SMTP budget" in caplog.text
    assert KEY not in caplog.text
    assert KEY not in repr(outcomes)
