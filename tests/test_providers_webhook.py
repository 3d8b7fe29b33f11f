"""The webhook adapter against a receiver that verifies Standard Webhooks signatures itself."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from delivery.core.outcomes import Delivered, LookupFailed, Permanent, Retryable, Unknown
from delivery.errors import ConfigError
from delivery.providers import Envelope
from delivery.providers.webhook import decode_secrets, sign
from tests.provider_stubs import Reply, WebhookReceiver, provider_from

SECRET = "whsec_" + base64.b64encode(b"webhook-signing-key-0123456789ab").decode()
PAYLOAD = {"event": "order.paid", "order": 42, "note": "café"}


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(SECRET) as server:
        yield server


@pytest.fixture(autouse=True)
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", SECRET)


LOOPBACK_RECEIVER = {"allow_networks": ["127.0.0.1/32"]}  # the documented way for internal ones


def hooks(**extra: Any) -> Any:
    table = {"kind": "webhook", "secret_env": "TEST_WEBHOOK_SECRET", **LOOPBACK_RECEIVER, **extra}
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
    [SECRET, SECRET.rstrip("="), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    ids=["padded", "unpadded", "spec_example_24_bytes"],
)
def test_reference_library_verifies_our_signature(
    monkeypatch: pytest.MonkeyPatch, secret_value: str
) -> None:
    """A receiver using the reference library (standardwebhooks.Webhook(secret).verify) with
    the same whsec_ secret, padded or not, verifies what we send and gets the payload back."""
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", secret_value)
    with WebhookReceiver(secret_value) as receiver:
        provider = hooks()
        assert provider.send(hook(receiver)) == Delivered(None, 204)
        provider.close()
        [request] = receiver.sent()
        assert receiver.verified == [True]
        assert Webhook(secret_value).verify(request.body, request.headers) == PAYLOAD


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
    other = "whsec_" + base64.b64encode(b"another-key-than-the-receiver's").decode()
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", other)
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
    table = {"kind": "webhook", "secret_env": "TEST_WEBHOOK_SECRET", **LOOPBACK_RECEIVER}
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
    signed_then = Webhook(SECRET).sign(
        "order-42:paid", dt.datetime.fromtimestamp(1_700_000_000, dt.UTC), a.body.decode()
    )
    assert a.headers["webhook-signature"] == signed_then  # the reference library's signature
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


BAD_SECRETS = {
    "plain": "a-plain-shared-secret-of-enough-length",
    "not_base64": "whsec_not*base64",
    "short": "whsec_" + base64.b64encode(b"only-23-bytes-of-secret").decode(),
    "urlsafe_alphabet": "whsec_" + base64.urlsafe_b64encode(b"\xfb" * 30).decode(),
    "one_good_one_bad": SECRET + " whsec_c2hvcnQ=",
}


@pytest.mark.parametrize(
    "value", [None, "", *BAD_SECRETS.values()], ids=["unset", "empty", *BAD_SECRETS]
)
def test_no_usable_secret_sends_nothing(
    receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    """Without a usable secret (unset, empty, not whsec_ + base64, under 24 bytes) nothing goes
    out unsigned: permanent NO_CREDENTIALS naming providers.p.secret_env."""
    from delivery.providers.webhook import WebhookProvider
    from tests.provider_stubs import settings_with

    monkeypatch.delenv("TEST_WEBHOOK_SECRET")  # settings load where the secret is not held
    table = {"kind": "webhook", "secret_env": "TEST_WEBHOOK_SECRET", **LOOPBACK_RECEIVER}
    config = settings_with({"p": table}).providers["p"]
    if value is not None:  # ... and the worker holds a bad one
        monkeypatch.setenv("TEST_WEBHOOK_SECRET", value)
    provider = WebhookProvider(config)
    outcome = provider.send(hook(receiver))
    provider.close()
    assert isinstance(outcome, Permanent) and outcome.code == "NO_CREDENTIALS"
    assert "providers.p.secret_env" in outcome.reason
    assert receiver.requests == []


@pytest.mark.parametrize("value", ["", *BAD_SECRETS.values()], ids=["empty", *BAD_SECRETS])
def test_a_malformed_secret_is_a_config_error_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """A process that holds a malformed secret fails when settings load, with a ConfigError
    naming providers.p.secret_env (and the secret itself is not in the message)."""
    monkeypatch.setenv("TEST_WEBHOOK_SECRET", value)
    with pytest.raises(ConfigError) as err:
        hooks()
    assert err.value.key == "providers.p.secret_env"
    assert "TEST_WEBHOOK_SECRET" in str(err.value)
    for secret in value.split():
        assert secret not in str(err.value)


def test_secret_decoding_matches_the_reference_library() -> None:
    """Every secret we accept decodes to the very key the reference library uses."""
    for value in (SECRET, SECRET.rstrip("="), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"):
        [key] = decode_secrets(value)
        assert key == Webhook(value)._whsecret
        assert len(key) >= 24


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
