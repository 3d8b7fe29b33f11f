"""The outcome of one attempt, as a closed set of values (docs/concepts.md, "How a
message travels").

A provider adapter turns every answer and every transport error into exactly one of:

- ``Delivered``: the provider has it; ``provider_ref`` is its id.
- ``Retryable``: nothing took effect, or the provider asks us to come back; same key later.
  ``retry_after`` (seconds) is the provider's own wish and wins over backoff.
  ``created_nothing``: the answer proves that this request created nothing (it never left:
  a connect error; or the adapter's contract says the provider refused it before acting on
  it: 429, a documented 503). Only such attempts let a message move to another provider
  (``created_nothing``, the failover rule; docs/concepts.md, "Failover").
- ``Permanent``: it will never work (bad number, bad auth, key reused): ``dead``.
- ``Unknown``: the request was written and no answer came back; the message's policy decides.

A lookup (``GET ?idempotency_key=``) answers ``Found``, ``Absent`` or ``LookupFailed``, or
``Undeliverable`` when the provider has the message and reports that it failed for good
(Twilio's ``undelivered`` with a permanent ``error_code``): ``dead`` with that code, no resend.

``classify_exception`` is the one place where httpx's exceptions become outcomes: a connect
error or timeout means the request never left (safe to retry); any error after that means
the provider may have acted (unknown). Every outcome is bounded when it is built
(``delivery.core.bounds``), so whatever an adapter builds can be stored and printed.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import httpx

from delivery.core import bounds

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
    "bounded",
    "classify_exception",
    "classify_response",
    "created_nothing",
    "parse_json",
    "parse_retry_after",
]

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
NOT_PROCESSED_STATUS = frozenset({429, 503})
"""The reference protocol's answers given before a request is acted on (docs/providers.md):
rate limited, or unavailable. A 500, 502 or 504 may come after the message was created."""


_FIELDS = (("code", bounds.code), ("reason", bounds.text), ("provider_ref", bounds.ref))


class _Bounded:
    """Every outcome class: its provider-controlled fields made storable as it is built."""

    __slots__ = ()

    def __post_init__(self) -> None:
        status = getattr(self, "http_status", None)
        if status is not None and not (isinstance(status, int) and 100 <= status <= 999):
            object.__setattr__(self, "http_status", None)
        for name, bound in _FIELDS:
            if hasattr(self, name):
                object.__setattr__(self, name, bound(getattr(self, name)))


@dataclass(frozen=True, slots=True)
class Delivered(_Bounded):
    provider_ref: str | None
    http_status: int | None = None
    kind: str = "delivered"


@dataclass(frozen=True, slots=True)
class Retryable(_Bounded):
    code: str
    reason: str
    http_status: int | None = None
    retry_after: float | None = None
    created_nothing: bool = False
    kind: str = "retryable"

    def __post_init__(self) -> None:
        super(Retryable, self).__post_init__()
        object.__setattr__(self, "retry_after", bounds.delay(self.retry_after))


@dataclass(frozen=True, slots=True)
class Permanent(_Bounded):
    code: str
    reason: str
    http_status: int | None = None
    kind: str = "permanent"


@dataclass(frozen=True, slots=True)
class Unknown(_Bounded):
    code: str
    reason: str
    http_status: int | None = None
    kind: str = "unknown"


@dataclass(frozen=True, slots=True)
class Found(_Bounded):
    provider_ref: str | None
    http_status: int | None = 200
    kind: str = "found"


@dataclass(frozen=True, slots=True)
class Absent(_Bounded):
    http_status: int | None = 404
    kind: str = "absent"


@dataclass(frozen=True, slots=True)
class LookupFailed(_Bounded):
    code: str
    reason: str
    http_status: int | None = None
    kind: str = "lookup_failed"


@dataclass(frozen=True, slots=True)
class Undeliverable(_Bounded):
    code: str
    reason: str
    provider_ref: str | None = None
    http_status: int | None = 200
    kind: str = "undeliverable"


Outcome = Delivered | Retryable | Permanent | Unknown
LookupOutcome = Found | Absent | LookupFailed | Undeliverable
AnyOutcome = TypeVar("AnyOutcome", bound=Outcome | LookupOutcome)


def created_nothing(outcome: Outcome) -> bool:
    """Whether ``outcome`` proves that its attempt created nothing at the provider: the one
    question the failover rule asks of an attempt (docs/concepts.md, "Failover"). Only a
    ``Retryable`` that says so (``created_nothing``); an ``Unknown``, a ``Permanent`` (a 422
    says the key exists there) or any other retryable answer (a 500 may come after the
    message was created, a 409 says our earlier attempt is running) may have taken effect,
    and pins the message to its provider."""
    return isinstance(outcome, Retryable) and outcome.created_nothing


def bounded(outcome: AnyOutcome, recipient: str) -> AnyOutcome:
    """``outcome`` with the message's own ``recipient`` masked in its code and reason too, and
    in a provider reference that holds it (the rest of the bounds were applied when it was
    built)."""
    if isinstance(outcome, Delivered | Found):
        ref = outcome.provider_ref  # checked cheaply first: this runs for every delivery
        if ref is not None and recipient and recipient.lstrip("+").lower() in ref.lower():
            return cast(
                AnyOutcome, replace(outcome, provider_ref=bounds.unrecipient(ref, recipient))
            )
        return outcome
    if isinstance(outcome, Retryable | Permanent | Unknown | LookupFailed | Undeliverable):
        masked = replace(
            outcome,
            code=bounds.code(outcome.code, recipient),
            reason=bounds.text(outcome.reason, recipient=recipient),
        )
        return cast(AnyOutcome, masked)
    return outcome


def parse_retry_after(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), clamped to
    ``0 .. bounds.MAX_RETRY_AFTER`` (one day); ``None`` when absent or not understood."""
    if value is None or not value.strip():
        return None
    value = value.strip()[:64]
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        try:
            seconds = (when - (now or dt.datetime.now(dt.UTC))).total_seconds()
        except OverflowError:
            return None
    if seconds != seconds:
        return None
    return bounds.delay(seconds)


def parse_json(response: httpx.Response) -> Any:
    """The answer's JSON value; None for an empty body or one that is not JSON."""
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
    body = parse_json(response)
    if 200 <= status < 300:
        ref = body.get(ref_field) if isinstance(body, dict) else None
        if ref not in (None, ""):
            return Delivered(str(ref), status)
        if not has_reference:
            return Delivered(None, status)
        what = "a non-JSON body" if body is None else f"no {ref_field!r}"
        return Unknown("NO_PROVIDER_REF", f"HTTP {status} with {what}", status)
    code = _code(body, status)
    busy = status == 409 and code == "IDEMPOTENCY_IN_PROGRESS"
    if busy or status in RETRYABLE_STATUS or (status >= 500 and status != 501):
        reason = "the provider is still processing this key" if busy else _reason(body, response)
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        refused = not busy and status in NOT_PROCESSED_STATUS
        return Retryable(code, reason, status, retry_after, created_nothing=refused)
    return Permanent(code, _reason(body, response), status)


def classify_exception(exc: httpx.HTTPError) -> Retryable | Permanent | Unknown:
    """Map an httpx error to an outcome: before the request left -> retryable, after -> unknown."""
    name = type(exc).__name__
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Retryable(f"NETWORK_{name}", f"request not sent: {exc}"[:500], created_nothing=True)
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
        return Permanent(f"CLIENT_{name}", str(exc)[:500])
    return Unknown(f"NETWORK_{name}", f"request sent, no answer: {exc}"[:500])
