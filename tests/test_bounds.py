"""G7 and G6 at the primitives: provider text made storable (length, control characters,
recipients masked), Retry-After and backoff clamped, adapter exceptions turned into outcomes,
and answers read with a body limit and a deadline."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delivery.config.settings import Backoff, ProviderConfig, Timeouts
from delivery.core import bounds
from delivery.core.backoff import MAX_BACKOFF, compute_backoff
from delivery.core.outcomes import (
    Delivered,
    Found,
    LookupFailed,
    Permanent,
    Retryable,
    Unknown,
    parse_retry_after,
)
from delivery.errors import InvalidMessage
from delivery.outbox.validation import check_recipient
from delivery.providers import calls
from delivery.providers.base import Envelope
from delivery.providers.client import BODY_LIMIT
from delivery.providers.http import HttpProvider

NUMBER = "+12015550463"
SPELLINGS = [
    NUMBER,
    "12015550463",
    "+1 201 555 0463",
    "+1 (201) 555-0463",
    "(201) 555-0463",
    "201.555.0463",
    "0044 20 7946 0958",
    "+44 20 7946 0958",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_phone_numbers_in_any_spelling_are_masked(spelling: str) -> None:
    """A phone number in a provider's text is masked whatever its spelling."""
    stored = bounds.text(f"The 'To' number {spelling} is not a valid phone number.")
    digits = "".join(ch for ch in spelling if ch.isdigit())
    assert digits[-7:] not in "".join(ch for ch in stored if ch.isdigit())
    assert "[number]" in stored


def test_emails_and_the_recipient_itself_are_masked() -> None:
    """Email addresses, and the message's own recipient in any case, never survive."""
    odd = "o'brien+$x|y&z`{id}`~!#%*=?^@example.com"
    stored = bounds.text(f"mailbox <Ann.Lee@Example.com> and {odd.upper()} refused", recipient=odd)
    assert "Ann.Lee" not in stored and "o'brien".upper() not in stored
    hook = "https://hooks.example.com/h/7?token=abc"
    assert hook not in bounds.text(f"POST {hook} refused", recipient=hook)


def test_a_recipient_already_partly_masked_is_still_found() -> None:
    """A webhook URL with a long number in it, masked in part when the outcome was built,
    is still masked whole once the pipeline adds the recipient."""
    hook = "https://hooks.example.com/tenant/123456789/in"
    outcome = calls.send(Raising(value=Permanent("BAD", f"POST {hook} refused")), _hook(hook))  # type: ignore[arg-type]
    assert isinstance(outcome, Permanent)
    assert "hooks.example.com" not in outcome.reason and "[recipient]" in outcome.reason


def test_codes_refs_and_plain_text_keep_their_meaning() -> None:
    """Error codes, short numbers and identifiers are not masked: only what looks like a
    recipient is."""
    assert bounds.code("21211") == "21211"
    assert bounds.text("HTTP 503 Service Unavailable") == "HTTP 503 Service Unavailable"
    assert bounds.text("error 21614 on SM1234567890abcdef") == "error 21614 on SM1234567890abcdef"
    assert bounds.ref(12345678901) == "12345678901"  # a numeric emailId is a reference


@given(st.text(max_size=3000))
def test_any_text_becomes_storable(value: str) -> None:
    """Whatever a provider sends, the stored code, reason and reference fit their columns and
    carry no control, format or surrogate character."""
    for stored, limit in (
        (bounds.code(value), bounds.CODE_LENGTH),
        (bounds.text(value), bounds.REASON_LENGTH),
        (bounds.ref(value) or "", bounds.REF_LENGTH),
    ):
        assert len(stored) <= limit
        assert bounds.printable(stored) == stored
        stored.encode("utf-8")  # no lone surrogate: PostgreSQL would refuse it
        assert "\x00" not in stored


def test_control_characters_never_reach_a_terminal() -> None:
    """Escape sequences, bidi overrides, NUL and C1 controls become spaces."""
    assert bounds.printable("a\x1b[31mred\x00\x9b\u202eb") == "a [31mred   b"


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.text(max_size=80),
        st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)).map(
            lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT")
        ),
    )
)
def test_retry_after_is_clamped_whatever_the_header(header: str) -> None:
    """Any Retry-After (seconds, HTTP date, negative, huge, NaN, garbage) gives None or a
    delay in 0 .. MAX_RETRY_AFTER that a datetime can take."""
    seconds = parse_retry_after(header)
    if seconds is not None:
        assert 0.0 <= seconds <= bounds.MAX_RETRY_AFTER
        dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)


def test_retry_after_bounds_on_the_reported_cases() -> None:
    """The observed 999999999999 is one day; a negative wait is none; NaN is ignored."""
    assert parse_retry_after("999999999999") == bounds.MAX_RETRY_AFTER
    assert parse_retry_after("-5") == 0.0
    assert parse_retry_after("nan") is None
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT") == bounds.MAX_RETRY_AFTER


@given(
    attempt=st.integers(min_value=-5, max_value=10**6),
    retry_after=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    base=st.floats(min_value=0.0, max_value=1e300),
    cap=st.floats(min_value=0.0, max_value=1e300),
)
def test_backoff_never_overflows_a_datetime(
    attempt: int, retry_after: float | None, base: float, cap: float
) -> None:
    """compute_backoff gives a finite delay in 0 .. MAX_BACKOFF for any inputs, so
    ``now + delay`` never overflows."""
    delay = compute_backoff(attempt, Backoff(base=base, cap=cap), retry_after)
    assert math.isfinite(delay) and 0.0 <= delay <= MAX_BACKOFF
    dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delay)


def test_outcomes_bound_themselves_when_built() -> None:
    """An outcome built by any adapter already fits: a 300-character code, a huge wait and a
    status outside HTTP's range are bounded on construction."""
    outcome = Retryable("X" * 300, "why\x00" * 1000, 70000, retry_after=1e18)
    assert len(outcome.code) <= 64 and len(outcome.reason) <= 500
    assert outcome.retry_after == bounds.MAX_RETRY_AFTER and outcome.http_status is None
    assert Delivered("r" * 1000).provider_ref is not None
    assert len(Delivered("r" * 1000).provider_ref or "") == 255


def test_invalid_recipients_are_not_echoed() -> None:
    """InvalidMessage names the field and the problem, never the recipient's value."""
    for channel, to in (
        ("sms", "2015550199"),
        ("sms", "+1201555019"),
        ("sms", "+1 201 555 0199"),
        ("email", "leaky.person@@example.com"),
        ("email", "leaky.person@example"),
        ("webhook", "ftp://leaky-host.example.com/x"),
    ):
        with pytest.raises(InvalidMessage) as caught:
            check_recipient(channel, to)
        assert caught.value.field == "to"
        for part in (to, "leaky", "555019", "5550199"):
            assert part not in str(caught.value), str(caught.value)


# --- adapter calls ----------------------------------------------------------------------


class Raising:
    """An adapter whose send and lookup raise ``exc`` (or return ``value``)."""

    name = "broken"

    def __init__(self, exc: Exception | None = None, value: object = None) -> None:
        self.exc, self.value = exc, value

    def send(self, envelope: Envelope) -> object:
        if self.exc is not None:
            raise self.exc
        return self.value

    def lookup(self, envelope: Envelope) -> object:
        return self.send(envelope)

    def close(self) -> None:
        pass


ENVELOPE = Envelope("k-1", "sms", NUMBER, {"body": "hi"})


def _hook(url: str) -> Envelope:
    return Envelope("k-1", "webhook", url, {"e": 1})


@pytest.mark.parametrize(
    ("exc", "kind", "code"),
    [
        (httpx.InvalidURL(f"bad url http://x/{NUMBER}"), Permanent, "CLIENT_InvalidURL"),
        (ValueError(f"cannot send to {NUMBER}"), Unknown, calls.ADAPTER_ERROR),
        (KeyError("body"), Unknown, calls.ADAPTER_ERROR),
        (httpx.ConnectError(f"refused {NUMBER}"), Retryable, "NETWORK_ConnectError"),
        (httpx.ReadTimeout("late"), Unknown, "NETWORK_ReadTimeout"),
    ],
)
def test_any_adapter_exception_becomes_an_outcome(exc: Exception, kind: type, code: str) -> None:
    """An adapter that raises (httpx or not) yields a closed outcome whose text does not name
    the recipient; its lookup yields LookupFailed with the same code."""
    outcome = calls.send(Raising(exc), ENVELOPE)  # type: ignore[arg-type]
    assert type(outcome) is kind and outcome.code == code  # type: ignore[union-attr]
    assert NUMBER not in repr(outcome) and NUMBER[1:] not in repr(outcome)
    found = calls.lookup(Raising(exc), ENVELOPE)  # type: ignore[arg-type]
    assert isinstance(found, LookupFailed) and found.code == code


def test_a_stray_return_value_becomes_unknown() -> None:
    """An adapter that returns something other than an outcome yields Unknown, not a crash."""
    outcome = calls.send(Raising(value={"ok": True}), ENVELOPE)  # type: ignore[arg-type]
    assert isinstance(outcome, Unknown) and outcome.code == calls.ADAPTER_BAD_OUTCOME


def test_the_recipient_is_masked_in_an_adapters_outcome() -> None:
    """An outcome that quotes the recipient (any spelling) is masked before the pipeline
    sees it."""
    raw = Permanent(f"BAD_{NUMBER}", f"To {NUMBER} refused", 400)
    outcome = calls.send(Raising(value=raw), ENVELOPE)  # type: ignore[arg-type]
    assert isinstance(outcome, Permanent)
    assert "2015550463" not in outcome.code + outcome.reason


@pytest.mark.parametrize("ref", [NUMBER, NUMBER[1:], f"msg-{NUMBER}", f"{NUMBER[1:]}/1"])
def test_a_provider_reference_that_holds_the_recipient_is_masked(ref: str) -> None:
    """A provider that echoes the number as its id: the reference that Flower and the CLI show
    is masked, and a reference that only looks like a number is kept."""
    sent = calls.send(Raising(value=Delivered(ref, 200)), ENVELOPE)  # type: ignore[arg-type]
    found = calls.lookup(Raising(value=Found(ref)), ENVELOPE)  # type: ignore[arg-type]
    for outcome in (sent, found):
        assert "2015550463" not in repr(outcome) and "[recipient]" in repr(outcome)
    other = Delivered("12025550199", 201)
    assert calls.send(Raising(value=other), ENVELOPE) == other  # type: ignore[arg-type]


# --- answers read with a limit and a deadline --------------------------------------------


def _http(handler: httpx.MockTransport | None = None, **timeouts: float) -> HttpProvider:
    config = ProviderConfig("p", "http", "http://127.0.0.1:9", Timeouts(**timeouts))
    return HttpProvider(config, transport=handler)


def test_a_huge_body_is_read_only_up_to_the_limit() -> None:
    """A 50 MB error body is cut at BODY_LIMIT: the outcome comes back, bounded."""
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        def chunks() -> Iterator[bytes]:
            for _ in range(50 * 16):
                seen.append(1)
                yield b"x" * 65536

        return httpx.Response(500, content=chunks())

    provider = _http(httpx.MockTransport(handler))
    outcome = provider.send(ENVELOPE)
    assert isinstance(outcome, Retryable) and outcome.code == "HTTP_500"
    assert len(seen) <= 2 + BODY_LIMIT // 65536  # the rest was never pulled


def test_a_gzip_bomb_inflates_no_further_than_the_limit() -> None:
    """A gzip body that inflates to 1 GB is decoded only up to the limit."""
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)  # ~64 KB on the wire

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, headers={"Content-Encoding": "gzip"}, content=iter([bomb] * 16))

    outcome = _http(httpx.MockTransport(handler)).send(ENVELOPE)
    assert isinstance(outcome, Permanent) and outcome.code == "HTTP_400"


def test_a_gzip_json_answer_is_still_understood() -> None:
    """Compressed answers within the limit are decoded: the provider's id is read."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = gzip.compress(b'{"id": "msg_1"}')
        return httpx.Response(201, headers={"Content-Encoding": "gzip"}, content=body)

    assert _http(httpx.MockTransport(handler)).send(ENVELOPE) == Delivered("msg_1", 201)


@pytest.fixture
def drip() -> Iterator[int]:
    """A server on a free port that answers headers at once, then one body byte per 0.3 s
    for a minute."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 200\r\n\r\n")
                for _ in range(200):
                    if stop.wait(0.3):
                        break
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def test_a_slow_drip_ends_at_the_attempts_deadline(drip: int) -> None:
    """A body dripping in forever (each read well inside the read timeout) ends the attempt
    as unknown once the whole exchange passes its deadline, long before the drip ends."""
    config = ProviderConfig(
        "p", "http", f"http://127.0.0.1:{drip}", Timeouts(connect=0.5, write=0.5, read=1, pool=0)
    )
    provider = HttpProvider(config)
    started = time.monotonic()
    outcome = provider.send(ENVELOPE)
    took = time.monotonic() - started
    provider.close()
    assert isinstance(outcome, Unknown) and outcome.code == "NETWORK_ReadTimeout"
    assert took < 30  # the drip alone lasts 60 s


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=4096), st.sampled_from(["gzip", "deflate", "br", "gzip, gzip", ""]))
def test_garbage_with_any_encoding_is_an_outcome(body: bytes, encoding: str) -> None:
    """A body that is not what its Content-Encoding says is read as empty, not raised."""

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"Content-Encoding": encoding} if encoding else {}
        return httpx.Response(502, headers=headers, content=iter([body]))

    outcome = _http(httpx.MockTransport(handler)).send(ENVELOPE)
    assert isinstance(outcome, Retryable)


# --- what is printed -----------------------------------------------------------------------


def test_cli_output_cannot_drive_the_terminal(session: Any) -> None:
    """A stored error text with escape sequences, C1 controls and bidi overrides (a row
    written before the bounds, or by hand) prints without them in `show`, `dead` and their
    JSON, which still carries the same value as escapes; the payload hash is not shown."""
    from click.testing import CliRunner

    from delivery.cli import main
    from tests.factories import add

    evil = "boom \x1b[2J\x1b]0;pwned\x07 \x9b31m \u202egnp.exe"
    add(session, "evil-1", "dead", last_error=evil, last_error_code="X\x1bY", payload_hash="h" * 64)
    for args in (["show", "evil-1"], ["show", "evil-1", "--json"], ["dead"], ["dead", "--json"]):
        output = CliRunner().invoke(main, args).output
        assert not set(output) & {"\x1b", "\x07", "\x9b", "\u202e"}, (args, output)
        assert "h" * 64 not in output
    shown = json.loads(CliRunner().invoke(main, ["show", "evil-1", "--json"]).output)
    assert "boom" in shown["last_error"] and "payload_hash" not in shown


def test_the_worker_quiets_httpx_unless_told_otherwise() -> None:
    """The worker sets httpx's and httpcore's loggers to WARNING (their INFO lines carry
    URLs), but leaves a level the user set."""
    from delivery.worker.app import quiet_http_loggers

    quiet, chosen = logging.getLogger("httpx"), logging.getLogger("httpcore")
    saved = quiet.level, chosen.level
    try:
        quiet.setLevel(logging.NOTSET)
        chosen.setLevel(logging.DEBUG)
        quiet_http_loggers()
        assert quiet.level == logging.WARNING and chosen.level == logging.DEBUG
    finally:
        quiet.setLevel(saved[0])
        chosen.setLevel(saved[1])


def test_database_errors_do_not_carry_parameters(tmp_path: Any) -> None:
    """A failed statement on an outbox engine does not quote its parameters (a recipient or
    a payload) in the exception a worker would log."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from delivery.runtime.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path}/x.sqlite3")
    try:
        with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
            conn.execute(text("INSERT INTO missing (to_) VALUES (:to)"), {"to": "leak@example.com"})
    finally:
        engine.dispose()
    assert "leak@example.com" not in str(caught.value)
