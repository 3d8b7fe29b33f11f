"""The webhook adapter against a receiver that verifies Standard Webhooks signatures itself."""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from delivery.errors import ConfigError
from delivery.pipeline.outcomes import Delivered, LookupFailed, Permanent, Retryable, Unknown
from delivery.providers import Envelope
from delivery.providers.webhook import decode_secrets, sign
from tests.provider_stubs import Reply, WebhookReceiver, provider_from, verify_standard_webhook

SECRET = "whsec_" + base64.b64encode(b"webhook-signing-key-0123456789ab").decode()
PAYLOAD = {"event": "order.paid", "order": 42, "note": "café"}


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(SECRET) as server:
        yield server


@pytest.fixture(autouse=True)
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)


def hooks(**extra: Any) -> Any:
    table = {"kind": "webhook", "secret_env": "TEST_WEBHOOK_SECRET", **extra}
    return provider_from(table)


def hook(
    receiver: WebhookReceiver, path: str = "/hooks/orders", key: str = "order-42:paid"
) -> Envelope:
    return Envelope(key, "webhook", receiver.url + path, PAYLOAD)


def test_signature_matches_the_specs_published_test_vector() -> None:
    """Our signer reproduces the Standard Webhooks specification's own example signature."""
    keys = decode_secrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    assert sign(keys, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}') == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def test_delivery_is_signed_json_with_our_key_as_webhook_id(receiver: WebhookReceiver) -> None:
    """The POST carries the compact JSON payload, webhook-id = our key, a current timestamp and
    a v1 signature the receiver verifies independently; a 2xx is delivered with no reference."""
    provider = hooks()
    outcome = provider.send(hook(receiver))
    provider.close()
    [request] = receiver.sent()
    assert outcome == Delivered(None, 204)
    assert receiver.verified == [True]
    assert request.path == "/hooks/orders"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == "order-42:paid"
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 5
    assert request.headers["webhook-signature"].startswith("v1,")
    assert json.loads(request.body) == PAYLOAD
    assert b" " not in request.body.replace(b"order.paid", b"")  # compact, as signed


@pytest.mark.parametrize(
    "secret_value",
    [SECRET, "a-plain-shared-secret"],
    ids=["whsec_base64", "plain"],
)
def test_both_secret_forms_verify(monkeypatch: pytest.MonkeyPatch, secret_value: str) -> None:
    """A whsec_ secret signs with its decoded bytes, any other value with its UTF-8 bytes;
    a receiver holding the same secret verifies both."""
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", secret_value)
    with WebhookReceiver(secret_value) as receiver:
        provider = hooks()
        assert provider.send(hook(receiver)) == Delivered(None, 204)
        provider.close()
        assert receiver.verified == [True]


def test_rotation_signs_with_every_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """With two secrets configured, a receiver holding only the new one still verifies."""
    new = "whsec_" + base64.b64encode(b"the-new-key-after-rotation-00000").decode()
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", f"{SECRET} {new}")
    with WebhookReceiver(new) as receiver:
        provider = hooks()
        assert isinstance(provider.send(hook(receiver)), Delivered)
        provider.close()
        [request] = receiver.sent()
        assert len(request.headers["webhook-signature"].split(" ")) == 2
        assert receiver.verified == [True]


def test_wrong_secret_is_refused_by_the_receiver(
    receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver's check is real: a request signed with another secret fails (401, final)."""
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", "not-the-secret")
    provider = hooks()
    outcome = provider.send(hook(receiver))
    provider.close()
    assert receiver.verified == [False]
    assert isinstance(outcome, Permanent) and outcome.code == "HTTP_401"


MAPPING = [
    # (answer, outcome class, code, retry_after)
    (Reply(200, {"ok": True}), Delivered, None, None),
    (Reply(410, body="gone"), Permanent, "GONE", None),
    (
        Reply(503, body="busy", headers={"Webhook-Stop-Retries": "true"}),
        Permanent,
        "RECEIVER_STOPPED",
        None,
    ),
    (Reply(400, headers={"webhook-stop-retries": "TRUE"}), Permanent, "RECEIVER_STOPPED", None),
    (Reply(400, body="bad"), Permanent, "HTTP_400", None),
    (Reply(404, body="no"), Permanent, "HTTP_404", None),
    (Reply(301, headers={"Location": "http://127.0.0.1:9/elsewhere"}), Permanent, "HTTP_301", None),
    (Reply(501), Permanent, "HTTP_501", None),
    (Reply(408), Retryable, "HTTP_408", None),
    (Reply(429, headers={"Retry-After": "12"}), Retryable, "HTTP_429", 12.0),
    (Reply(500, body="oops"), Retryable, "HTTP_500", None),
    (Reply(503, body="<html>busy</html>", content_type="text/html"), Retryable, "HTTP_503", None),
    (Reply(503, headers={"Webhook-Stop-Retries": "false"}), Retryable, "HTTP_503", None),
]


@pytest.mark.parametrize(("answer", "kind", "code", "retry_after"), MAPPING)
def test_outcome_mapping(
    receiver: WebhookReceiver,
    answer: Reply,
    kind: type,
    code: str | None,
    retry_after: float | None,
) -> None:
    """A receiver's answers map to outcomes: 2xx delivered, 410 and Webhook-Stop-Retries dead,
    408/429/5xx retried (Retry-After honoured), redirects and other 4xx final."""
    receiver.push(answer)
    provider = hooks()
    outcome = provider.send(hook(receiver))
    provider.close()
    assert type(outcome) is kind
    assert getattr(outcome, "code", None) == code
    assert outcome.http_status == answer.status
    if kind is Retryable:
        assert outcome.retry_after == retry_after  # type: ignore[union-attr]
    assert len(receiver.sent()) == 1  # a redirect is not followed


def test_retries_keep_the_id_and_sign_a_fresh_timestamp(receiver: WebhookReceiver) -> None:
    """Every attempt carries the same webhook-id and its own, verifiable signature."""
    receiver.push(Reply(503))
    clock = iter([1_700_000_000.0, time.time()])
    table = {"kind": "webhook", "secret_env": "TEST_WEBHOOK_SECRET"}
    from delivery.providers.webhook import WebhookProvider
    from tests.provider_stubs import settings_with

    provider = WebhookProvider(
        settings_with({"h": table}).providers["h"], clock=lambda: next(clock)
    )
    first, second = provider.send(hook(receiver)), provider.send(hook(receiver))
    provider.close()
    assert isinstance(first, Retryable) and second == Delivered(None, 204)
    a, b = receiver.sent()
    assert a.headers["webhook-id"] == b.headers["webhook-id"] == "order-42:paid"
    assert a.headers["webhook-timestamp"] == "1700000000" != b.headers["webhook-timestamp"]
    assert verify_standard_webhook(SECRET, a.headers, a.body, tolerance=10**10)
    assert receiver.receipts == {"order-42:paid": 1}


def test_read_timeout_is_unknown_and_refused_connection_is_retryable(
    receiver: WebhookReceiver,
) -> None:
    """A receiver slower than the read timeout leaves the outcome unknown; a closed port is
    retryable (nothing was sent)."""
    receiver.push(Reply(delay=1.0))
    provider = hooks(timeouts={"read": 0.2})
    outcome = provider.send(hook(receiver))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    refused = provider.send(Envelope("k", "webhook", f"http://127.0.0.1:{closed}/hooks/x", PAYLOAD))
    provider.close()
    assert isinstance(outcome, Unknown) and outcome.code == "NETWORK_ReadTimeout"
    assert isinstance(refused, Retryable) and refused.code == "NETWORK_ConnectError"


@pytest.mark.parametrize("value", [None, "", "whsec_not*base64"])
def test_no_usable_secret_sends_nothing(
    receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    """Without a usable secret nothing goes out unsigned: permanent NO_CREDENTIALS."""
    if value is None:
        monkeypatch.delenv("TEST_WEBHOOK_SECRET")
    else:
        monkeypatch.setenv("TEST_WEBHOOK_SECRET", value)
    provider = hooks()
    outcome = provider.send(hook(receiver))
    provider.close()
    assert isinstance(outcome, Permanent) and outcome.code == "NO_CREDENTIALS"
    assert receiver.requests == []


def test_config_needs_secret_env_but_no_base_url() -> None:
    """A webhook provider needs secret_env (ConfigError naming it) and no base_url."""
    with pytest.raises(ConfigError) as err:
        provider_from({"kind": "webhook"})
    assert err.value.key == "providers.p.secret_env"
    provider = hooks()
    assert provider.lookup(Envelope("k", "webhook", "http://127.0.0.1/x", {})) == LookupFailed(
        "NO_LOOKUP", "a webhook receiver cannot be asked; use 'retry'"
    )
    provider.close()


def test_the_secret_is_never_logged(
    receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Deliveries and failures at DEBUG log level never print the secret or its key bytes."""
    caplog.set_level(logging.DEBUG)
    receiver.push(Reply(500, body="oops"))
    provider = hooks()
    outcomes = [provider.send(hook(receiver)), provider.send(hook(receiver))]
    provider.close()
    assert caplog.records
    raw = decode_secrets(SECRET)[0].decode()
    assert SECRET not in caplog.text and raw not in caplog.text
    assert SECRET not in repr(outcomes)
