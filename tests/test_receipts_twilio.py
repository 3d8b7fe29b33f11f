"""Twilio's delivery receipts: the adapter asks for them (``StatusCallback`` with the message's
key, a form field of Twilio's published CreateMessage), and the receiver takes only the
callbacks whose ``X-Twilio-Signature`` the ``twilio`` package's own ``RequestValidator``
accepts for the configured URL."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from twilio.request_validator import RequestValidator

from delivery.core.models import Message, Receipt
from delivery.receipts import Receiver
from delivery.receipts.twilio import TwilioReceipts, signature
from delivery.runtime.db import make_engine
from tests.factories import add
from tests.provider_stubs import TwilioStub
from tests.test_providers_twilio import FROM, SID, TO, TOKEN, sms, twilio, validate

CALLBACK = "https://hooks.example.com/receipts/twilio"
SMS_SID = "SM" + "0123456789abcdef" * 2


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_TWILIO_TOKEN", TOKEN)


def test_the_adapter_asks_for_receipts_with_the_key_in_the_url() -> None:
    """With status_callback_url set, each create carries StatusCallback = that URL with the
    message's key, and the request still matches Twilio's CreateMessage."""
    with TwilioStub(SID, TOKEN) as stub:
        provider = twilio(stub, status_callback_url=CALLBACK)
        provider.send(sms(key="signup-1:otp"))
        provider.close()
        [request] = stub.sent()
    callback = request.form()["StatusCallback"]
    assert callback == f"{CALLBACK}?{urlencode({'key': 'signup-1:otp'})}"
    assert parse_qs(urlsplit(callback).query) == {"key": ["signup-1:otp"]}
    assert validate(request) == "CreateMessage"


@pytest.fixture
def receiver(db_url: str) -> Iterator[httpx.Client]:
    engine = make_engine(db_url)
    app = Receiver(engine, {"twilio": TwilioReceipts("twilio", CALLBACK, TOKEN)})
    with httpx.Client(
        transport=httpx.WSGITransport(app=app), base_url="http://internal:8026"
    ) as client:
        yield client
    engine.dispose()


def callback(key: str, status: str = "delivered", **extra: str) -> tuple[str, dict[str, str]]:
    """The URL Twilio calls and the form it posts for ``key``'s message."""
    form = {"MessageSid": SMS_SID, "MessageStatus": status, "AccountSid": SID, "To": TO}
    form |= {"From": FROM, "ApiVersion": "2010-04-01", **extra}
    return f"{CALLBACK}?{urlencode({'key': key})}", form


def post(
    client: httpx.Client, url: str, form: dict[str, str], signed: str | None
) -> httpx.Response:
    """POST ``form`` as Twilio does to ``url``'s path and query, behind a proxy that changed
    the host; ``signed``: the X-Twilio-Signature to send (None: none)."""
    parts = urlsplit(url)
    headers = {} if signed is None else {"X-Twilio-Signature": signed}
    return client.post(f"{parts.path}?{parts.query}", data=form, headers=headers)


def test_our_signature_is_twilios() -> None:
    """The receiver's signature of a callback is the one twilio's RequestValidator computes
    and accepts."""
    url, form = callback("k")
    validator = RequestValidator(TOKEN)
    assert signature(TOKEN, url, form) == validator.compute_signature(url, form)
    assert validator.validate(url, form, signature(TOKEN, url, form))


def test_a_signed_callback_moves_the_message_and_is_stored_once(
    receiver: httpx.Client, session: Session
) -> None:
    """A delivered callback signed by Twilio's validator, arriving through a proxy that
    rewrote the host, is stored and delivers the message; its retry is stored once."""
    add(session, "tw-1", "sent", provider="twilio", provider_ref=SMS_SID)
    url, form = callback("tw-1", ErrorCode="")
    signed = RequestValidator(TOKEN).compute_signature(url, form)
    for _ in range(2):
        assert post(receiver, url, form, signed).status_code == 200
    session.expire_all()
    assert session.scalars(select(Message.status)).one() == "delivered"
    assert session.scalars(select(Receipt.event)).all() == [f"{SMS_SID}:delivered"]


def test_an_undelivered_callback_keeps_its_error_code(
    receiver: httpx.Client, session: Session
) -> None:
    """undelivered with ErrorCode 30003 (unreachable handset): undelivered, the code kept."""
    add(session, "tw-2", "sent", provider="twilio", provider_ref=SMS_SID)
    url, form = callback("tw-2", "undelivered", ErrorCode="30003")
    signed = RequestValidator(TOKEN).compute_signature(url, form)
    assert post(receiver, url, form, signed).status_code == 200
    assert session.scalars(select(Receipt.code)).one() == "30003"
    session.expire_all()
    assert session.scalars(select(Message.status)).one() == "undelivered"


@pytest.mark.parametrize(
    "forgery", ["wrong token", "rewritten host", "no header", "another parameter", "other key"]
)
def test_a_forged_callback_is_403_and_writes_nothing(
    receiver: httpx.Client, session: Session, forgery: str
) -> None:
    """A signature made with another token, for the URL a proxy rewrote, none at all, a body
    replayed with one more parameter, or another message's key: 403, nothing stored."""
    add(session, "tw-3", "sent", provider="twilio", provider_ref=SMS_SID)
    url, form = callback("tw-3")
    signed: str | None = RequestValidator(TOKEN).compute_signature(url, form)
    if forgery == "wrong token":
        signed = RequestValidator("another-token").compute_signature(url, form)
    elif forgery == "rewritten host":
        internal = url.replace("https://hooks.example.com", "http://internal:8026")
        signed = RequestValidator(TOKEN).compute_signature(internal, form)
    elif forgery == "no header":
        signed = None
    elif forgery == "another parameter":
        form = {**form, "MessageStatus": "undelivered"}
    else:
        url = url.replace("tw-3", "tw-9")
    assert post(receiver, url, form, signed).status_code == 403
    assert session.scalars(select(Receipt)).all() == []
    session.expire_all()
    assert session.scalars(select(Message.status)).one() == "sent"
