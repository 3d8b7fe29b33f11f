"""Pure functions: backoff, Retry-After, and the one place answers become outcomes."""

from __future__ import annotations

import datetime as dt
import email.utils
import random

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delivery.config.settings import Backoff
from delivery.core.backoff import compute_backoff
from delivery.core.outcomes import (
    Delivered,
    Outcome,
    Permanent,
    Retryable,
    Unknown,
    classify_exception,
    classify_response,
    created_nothing,
    parse_retry_after,
)


@given(
    attempt=st.integers(0, 200),
    base=st.floats(0.001, 10),
    cap=st.floats(10, 1000),
    seed=st.integers(),
)
def test_backoff_is_within_full_jitter_bounds(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    """Every delay lies in [0, min(cap, base * 2**attempt)]."""
    delay = compute_backoff(attempt, Backoff(base, cap), None, random.Random(seed))
    assert 0.0 <= delay <= min(cap, base * 2.0 ** min(attempt, 62))


@given(retry_after=st.floats(0, 10_000), attempt=st.integers(0, 50))
def test_retry_after_wins_over_backoff(retry_after: float, attempt: int) -> None:
    """A Retry-After is used as is: never shorter, and not capped."""
    assert compute_backoff(attempt, Backoff(1, 5), retry_after) == retry_after


def test_backoff_spreads_out() -> None:
    """Full jitter really is random: 100 delays are not all the same."""
    rng = random.Random(1)
    assert len({compute_backoff(5, Backoff(1, 60), None, rng) for _ in range(100)}) > 90


def test_parse_retry_after_seconds_and_http_date() -> None:
    """Retry-After is read as delta-seconds or as an HTTP date; garbage is ignored."""
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    later = email.utils.format_datetime(now + dt.timedelta(seconds=30), usegmt=True)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(later, now) == 30.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None


def answer(
    status: int,
    body: object = None,
    *,
    html: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    if html is not None:
        return httpx.Response(status, text=html, headers=headers)
    if body is None:
        return httpx.Response(status, headers=headers)
    return httpx.Response(status, json=body, headers=headers)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (answer(201, {"id": "msg_1"}), Delivered("msg_1", 201)),
        (answer(200, {"status": "ok"}), Unknown),
        (answer(200, html="<html>ok</html>"), Unknown),
        (answer(204), Unknown),
        (
            answer(400, {"code": 21211, "message": "Invalid To"}),
            Permanent("21211", "Invalid To", 400),
        ),
        (answer(401, {"code": "AUTH"}), Permanent),
        (answer(422, {"code": "IDEMPOTENCY_KEY_REUSED"}), Permanent),
        (answer(409, {"code": "IDEMPOTENCY_IN_PROGRESS"}), Retryable),
        (answer(409, {"code": "CONFLICT"}), Permanent),
        (answer(503, html="<h1>down</h1>"), Retryable),
        (
            answer(429, {"code": "RATE_LIMITED"}, headers={"Retry-After": "3"}),
            Retryable("RATE_LIMITED", "HTTP 429 Too Many Requests", 429, 3.0, True),
        ),
        (answer(502), Retryable),
        (answer(504), Retryable),
        (answer(408), Retryable),
        (answer(501), Permanent),
    ],
)
def test_classify_response(response: httpx.Response, expected: object) -> None:
    """Each answer of the reference protocol maps to its outcome class (DESIGN section 5)."""
    outcome = classify_response(response)
    if isinstance(expected, type):
        assert isinstance(outcome, expected), outcome
    else:
        assert outcome == expected


def test_2xx_without_reference_is_delivered_when_the_kind_has_none() -> None:
    """A provider kind that returns no id may still be delivered on a bare 2xx."""
    assert classify_response(answer(204), has_reference=False) == Delivered(None, 204)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx.ConnectError("refused"), Retryable),
        (httpx.ConnectTimeout("slow"), Retryable),
        (httpx.PoolTimeout("busy"), Retryable),
        (httpx.ReadTimeout("lost"), Unknown),
        (httpx.RemoteProtocolError("disconnected"), Unknown),
        (httpx.ReadError("reset"), Unknown),
        (httpx.WriteTimeout("half"), Unknown),
        (httpx.UnsupportedProtocol("ftp"), Permanent),
    ],
)
def test_classify_exception(exc: httpx.HTTPError, expected: type) -> None:
    """Errors before the request left are retryable; after it was written, unknown."""
    assert isinstance(classify_exception(exc), expected)


@pytest.mark.parametrize(
    ("outcome", "nothing"),
    [
        (classify_exception(httpx.ConnectError("refused")), True),
        (classify_exception(httpx.ConnectTimeout("slow")), True),
        (classify_exception(httpx.PoolTimeout("busy")), True),
        (classify_exception(httpx.ReadTimeout("lost")), False),
        (classify_exception(httpx.WriteTimeout("half")), False),
        (classify_response(answer(429, {"code": "RATE_LIMITED"})), True),
        (classify_response(answer(503, html="<h1>down</h1>")), True),
        (classify_response(answer(500)), False),
        (classify_response(answer(502)), False),
        (classify_response(answer(504)), False),
        (classify_response(answer(408)), False),
        (classify_response(answer(409, {"code": "IDEMPOTENCY_IN_PROGRESS"})), False),
        (classify_response(answer(422, {"code": "IDEMPOTENCY_KEY_REUSED"})), False),
        (classify_response(answer(201, {"id": "msg_1"})), False),
    ],
)
def test_created_nothing_only_where_the_request_cannot_have_acted(
    outcome: Outcome, nothing: bool
) -> None:
    """The failover rule's question of an attempt (docs/concepts.md, "Failover"): only an
    answer that proves nothing was created lets a message move to another provider; a 5xx
    other than 503, a 409 in progress, an unknown or a 4xx pins it."""
    assert created_nothing(outcome) is nothing
