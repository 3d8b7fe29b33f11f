"""G7 per adapter, by property: whatever status, headers and body a provider (or a webhook
receiver) answers, each adapter gives one of the closed outcomes, and every field of it is
stored on real PostgreSQL in the columns the pipeline writes (attempt row and message row)."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, insert, select, update

from delivery.config.settings import Backoff, ProviderConfig, Timeouts
from delivery.core import bounds
from delivery.core.models import attempts_table, messages_table, utcnow
from delivery.core.outcomes import (
    Absent,
    Delivered,
    Found,
    LookupFailed,
    Permanent,
    Retryable,
    Unknown,
)
from delivery.core.policies import UnknownPolicy
from delivery.providers import calls
from delivery.providers.base import Envelope, Provider
from delivery.providers.http import HttpProvider
from delivery.providers.pigeon import PigeonProvider
from delivery.providers.twilio import TwilioProvider
from delivery.providers.webhook import WebhookProvider
from delivery.transitions import Sending
from delivery.transitions.attempts import log_attempt
from tests.factories import message_values

pytestmark = pytest.mark.integration

TO = "+12015550463"
SECRETS = {"B_TWILIO": "tok", "B_PIGEON": "key", "B_HOOK": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
TIMEOUTS = Timeouts(connect=1, write=1, read=2, pool=1)
OUTCOMES = (Delivered, Retryable, Permanent, Unknown)
LOOKUPS = (Found, Absent, LookupFailed)

# --- what a provider may answer -----------------------------------------------------------

_texts = st.one_of(
    st.text(max_size=40),
    st.text(min_size=200, max_size=2000),
    st.sampled_from([TO, f"The 'To' number {TO} is not valid", "x" * 300, "\x1b[31m\x00"]),
)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), _texts)
_fields = st.sampled_from(
    ["code", "message", "error", "id", "sid", "emailId", "messages", "next_page_uri", "status"]
)
_json_bodies = st.dictionaries(
    _fields, st.one_of(_scalars, st.lists(st.dictionaries(_fields, _scalars, max_size=4)))
).map(lambda d: json.dumps(d, allow_nan=True).encode())
_bodies = st.one_of(
    st.binary(max_size=2048),
    _json_bodies,
    _json_bodies.map(gzip.compress),
    st.just(b"A" * (200 * 1024)),  # over the body limit
)
_header_values = st.one_of(
    st.text(
        alphabet=st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"),
        max_size=60,
    ),
    st.sampled_from(["999999999999", "-1", "nan", "inf", "Fri, 31 Dec 9999 23:59:59 GMT", "1e999"]),
)
_headers = st.dictionaries(
    st.sampled_from(
        ["Retry-After", "Content-Type", "Webhook-Stop-Retries", "X-Anything", "Content-Encoding"]
    ),
    _header_values,
    max_size=4,
)


class Answer:
    """One answer of the mock provider."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def __call__(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(self.status, headers=self.headers, content=iter([self.body]))


_answers = st.builds(Answer, st.integers(min_value=100, max_value=599), _headers, _bodies)

# --- the adapters, each on a mock transport that plays the drawn answer --------------------


class Slot:
    """The answer the adapters' transports play next."""

    answer: Answer = Answer(200, {}, b"")

    def __call__(self, request: httpx.Request) -> httpx.Response:
        return self.answer(request)


def _config(kind: str, **options: Any) -> ProviderConfig:
    api_key_env = options.pop("api_key_env", None)
    return ProviderConfig(
        "p", kind, "http://127.0.0.1:9", TIMEOUTS, api_key_env=api_key_env, options=options
    )


@pytest.fixture(scope="module")
def adapters() -> Iterator[tuple[Slot, dict[str, Provider]]]:
    saved = {name: os.environ.get(name) for name in SECRETS}
    os.environ.update(SECRETS)
    slot = Slot()
    mock = httpx.MockTransport(slot)
    built: dict[str, Provider] = {
        "http": HttpProvider(_config("http"), mock),
        "twilio": TwilioProvider(
            _config("twilio", account_sid="AC1", auth_token_env="B_TWILIO", from_number=TO), mock
        ),
        "pigeon": PigeonProvider(_config("pigeon", api_key_env="B_PIGEON"), mock),
        "webhook": WebhookProvider(_config("webhook", secret_env="B_HOOK"), mock),
    }
    try:
        yield slot, built
    finally:
        for provider in built.values():
            provider.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _envelope(kind: str) -> Envelope:
    if kind == "webhook":
        return Envelope("k-1", "webhook", "https://hooks.example.com/h/1", {"event": "x"})
    if kind == "pigeon":
        return Envelope("k-1", "email", "ann@example.com", {"template": 7})
    return Envelope("k-1", "sms", TO, {"body": "Your code is 482901"})


def _fits(outcome: Any, recipient: str) -> None:
    """Every provider-controlled field is within its column and printable; no phone number in
    a code or reason, and not the message's own recipient in a provider reference either (any
    other number may be a reference)."""
    for name, limit in (("code", 64), ("reason", 500), ("provider_ref", 255)):
        value = getattr(outcome, name, None)
        if value is not None:
            assert len(value) <= limit and bounds.printable(value) == value, (name, value)
            value.encode("utf-8")
    retry_after = getattr(outcome, "retry_after", None)
    assert retry_after is None or 0 <= retry_after <= bounds.MAX_RETRY_AFTER
    said = f"{getattr(outcome, 'code', '')} {getattr(outcome, 'reason', '')}"
    assert TO not in said and TO[1:] not in said
    assert recipient not in repr(outcome) and recipient.lstrip("+") not in repr(outcome)


def _store(engine: Engine, outcome: Any, kind: str) -> None:
    """Write the outcome as the pipeline does (attempt row, message row) in a transaction that
    is rolled back: any overflow or refused character raises here."""
    with engine.connect() as conn, conn.begin() as tx:
        message_id = conn.execute(
            insert(messages_table)
            .values(message_values(f"bounds-{time.monotonic_ns()}", "sending"))
            .returning(messages_table.c.id)
        ).scalar_one()
        msg = Sending(message_id, "k", "p", 1, 5, UnknownPolicy.RETRY, Backoff(), utcnow())
        log_attempt(conn, msg, kind, outcome, time.perf_counter())
        conn.execute(
            update(messages_table)
            .where(messages_table.c.id == message_id)
            .values(
                last_error_code=getattr(outcome, "code", None),
                last_error=getattr(outcome, "reason", None),
                provider_ref=getattr(outcome, "provider_ref", None),
            )
        )
        stored = conn.execute(
            select(attempts_table.c.error_code, attempts_table.c.error).where(
                attempts_table.c.message_id == message_id
            )
        ).one()
        assert stored.error_code == getattr(outcome, "code", None)
        tx.rollback()


def _check(engine: Engine, slot: Slot, provider: Provider, kind: str, answer: Answer) -> None:
    slot.answer = answer
    envelope = _envelope(kind)
    outcome = calls.send(provider, envelope)
    assert isinstance(outcome, OUTCOMES)
    _fits(outcome, envelope.to)
    _store(engine, outcome, "send")
    found = calls.lookup(provider, envelope)
    assert isinstance(found, LOOKUPS)
    _fits(found, envelope.to)
    _store(engine, found, "lookup")


def _property(kind: str) -> Callable[..., None]:
    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(answer=_answers)
    def run(pg_engine: Engine, adapters: tuple[Slot, dict[str, Provider]], answer: Answer) -> None:
        slot, built = adapters
        _check(pg_engine, slot, built[kind], kind, answer)

    return run


def test_http_adapter_any_answer_is_a_storable_outcome(pg_engine: Engine, adapters: Any) -> None:
    """The reference adapter maps any status/headers/body to a closed, storable outcome."""
    _property("http")(pg_engine, adapters)


def test_twilio_adapter_any_answer_is_a_storable_outcome(pg_engine: Engine, adapters: Any) -> None:
    """The Twilio adapter maps any status/headers/body to a closed, storable outcome."""
    _property("twilio")(pg_engine, adapters)


def test_pigeon_adapter_any_answer_is_a_storable_outcome(pg_engine: Engine, adapters: Any) -> None:
    """The pigeon adapter maps any status/headers/body to a closed, storable outcome."""
    _property("pigeon")(pg_engine, adapters)


def test_webhook_adapter_any_answer_is_a_storable_outcome(pg_engine: Engine, adapters: Any) -> None:
    """The webhook adapter maps any receiver's status/headers/body to a closed, storable
    outcome."""
    _property("webhook")(pg_engine, adapters)


@pytest.mark.parametrize("kind", ["http", "twilio", "pigeon", "webhook"])
def test_the_reported_answers_are_storable(pg_engine: Engine, adapters: Any, kind: str) -> None:
    """The two observed failures: a 400 with a 300-character code, and a 429 with
    ``Retry-After: 999999999999``; both become storable outcomes on every adapter."""
    slot, built = adapters
    long_code = json.dumps({"code": "E" * 300, "message": f"bad {TO}"}).encode()
    _check(pg_engine, slot, built[kind], kind, Answer(400, {}, long_code))
    _check(pg_engine, slot, built[kind], kind, Answer(429, {"Retry-After": "999999999999"}, b""))
