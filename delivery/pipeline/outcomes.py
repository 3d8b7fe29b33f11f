"""The outcome of one attempt, as a closed set of values (DESIGN section 5).

A provider adapter turns every answer and every transport error into exactly one of:

- ``Delivered``: the provider has it; ``provider_ref`` is its id.
- ``Retryable``: nothing took effect, or the provider asks us to come back; same key later.
  ``retry_after`` (seconds) is the provider's own wish and wins over backoff.
- ``Permanent``: it will never work (bad number, bad auth, key reused): ``dead``.
- ``Unknown``: the request was written and no answer came back; the message's policy decides.

A lookup (``GET ?idempotency_key=``) answers ``Found``, ``Absent`` or ``LookupFailed``, or
``Undeliverable`` when the provider has the message and reports that it failed for good
(Twilio's ``undelivered`` with a permanent ``error_code``): ``dead`` with that code, no resend.

``classify_exception`` is the one place where httpx's exceptions become outcomes: a connect
error or timeout means the request never left (safe to retry); any error after that means
the provider may have acted (unknown).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = [
    "Absent",
    "Delivered",
    "Found",
    "LookupFailed",
    "LookupOutcome",
    "Outcome",
    "Permanent",
    "Retryable",
    "Undeliverable",
    "Unknown",
    "classify_exception",
    "classify_response",
    "parse_retry_after",
]

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class Delivered:
    provider_ref: str | None
    http_status: int | None = None
    kind: str = "delivered"


@dataclass(frozen=True, slots=True)
class Retryable:
    code: str
    reason: str
    http_status: int | None = None
    retry_after: float | None = None
    kind: str = "retryable"


@dataclass(frozen=True, slots=True)
class Permanent:
    code: str
    reason: str
    http_status: int | None = None
    kind: str = "permanent"


@dataclass(frozen=True, slots=True)
class Unknown:
    code: str
    reason: str
    http_status: int | None = None
    kind: str = "unknown"


@dataclass(frozen=True, slots=True)
class Found:
    provider_ref: str | None
    http_status: int | None = 200
    kind: str = "found"


@dataclass(frozen=True, slots=True)
class Absent:
    http_status: int | None = 404
    kind: str = "absent"


@dataclass(frozen=True, slots=True)
class LookupFailed:
    code: str
    reason: str
    http_status: int | None = None
    kind: str = "lookup_failed"


@dataclass(frozen=True, slots=True)
class Undeliverable:
    code: str
    reason: str
    provider_ref: str | None = None
    http_status: int | None = 200
    kind: str = "undeliverable"


Outcome = Delivered | Retryable | Permanent | Unknown
LookupOutcome = Found | Absent | LookupFailed | Undeliverable


def parse_retry_after(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        seconds = (when - (now or dt.datetime.now(dt.UTC))).total_seconds()
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return None
    return max(0.0, seconds)


def _json(response: httpx.Response) -> Any:
    try:
        return json.loads(response.content) if response.content else None
    except ValueError:
        return None


def _code(body: Any, status: int) -> str:
    if isinstance(body, dict) and body.get("code") not in (None, ""):
        return str(body["code"])
    return f"HTTP_{status}"


def _reason(body: Any, response: httpx.Response) -> str:
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])[:500]
    return f"HTTP {response.status_code} {response.reason_phrase}".strip()


def classify_response(
    response: httpx.Response, *, ref_field: str = "id", has_reference: bool = True
) -> Outcome:
    """Map one HTTP answer of the reference protocol to an outcome."""
    status = response.status_code
    body = _json(response)
    if 200 <= status < 300:
        ref = body.get(ref_field) if isinstance(body, dict) else None
        if ref not in (None, ""):
            return Delivered(str(ref), status)
        if not has_reference:
            return Delivered(None, status)
        what = "a non-JSON body" if body is None else f"no {ref_field!r}"
        return Unknown("NO_PROVIDER_REF", f"HTTP {status} with {what}", status)
    code = _code(body, status)
    if status in RETRYABLE_STATUS or (status >= 500 and status != 501):
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        return Retryable(code, _reason(body, response), status, retry_after)
    if status == 409 and code == "IDEMPOTENCY_IN_PROGRESS":
        return Retryable(
            code,
            "the provider is still processing this key",
            status,
            parse_retry_after(response.headers.get("retry-after")),
        )
    return Permanent(code, _reason(body, response), status)


def classify_exception(exc: httpx.HTTPError) -> Retryable | Permanent | Unknown:
    """Map an httpx error to an outcome: before the request left -> retryable, after -> unknown."""
    name = type(exc).__name__
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Retryable(f"NETWORK_{name}", f"request not sent: {exc}"[:500])
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
        return Permanent(f"CLIENT_{name}", str(exc)[:500])
    return Unknown(f"NETWORK_{name}", f"request sent, no answer: {exc}"[:500])
