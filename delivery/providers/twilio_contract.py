"""Twilio's Messages API contract: the create call's error codes, a listed message's statuses
and delivery error codes, and the two functions that judge them (``classify`` for a create
call's answer, ``judge`` for what a lookup found). ``delivery.providers.twilio`` (the
adapter) explains each row; tests/test_providers_twilio.py has a test per row.
"""

from __future__ import annotations

import datetime as dt
import email.utils
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from delivery.core import outcomes
from delivery.providers.client import parse_json

__all__ = [
    "CANCELED",
    "DELIVERED_STATUSES",
    "FAILED_STATUSES",
    "INBOUND_STATUSES",
    "PERMANENT_CODES",
    "RESEND_CODES",
    "RETRYABLE_CODES",
    "SUPPRESSING_CODES",
    "UNDELIVERABLE_CODES",
    "WRITTEN_STATUS",
    "classify",
    "judge",
    "matches_ours",
    "parse_date",
]

# Codes the create call answers that will fail the same way every time
# (twilio.com/docs/errors/NNNNN).
PERMANENT_CODES: Mapping[int, str] = {
    20003: "authentication failed (account sid or auth token)",
    20404: "resource not found (account sid)",
    21211: "invalid 'To' phone number",
    21212: "invalid 'From' phone number",
    21408: "permission to send an SMS has not been enabled for the region",
    21602: "message body is required",
    21603: "'From' phone number is required",
    21604: "'To' phone number is required",
    21606: "the 'From' number is not a valid message-capable phone number",
    21608: "the 'To' number is not verified (trial account)",
    21610: "attempt to send to an unsubscribed recipient (STOP)",
    21612: "the 'To' number is not reachable via SMS from this 'From' number",
    21614: "'To' number is not a valid mobile number",
    21617: "the message body exceeds the 1600 character limit",
}
# Server errors after the request was written: Twilio may have created the message, so the
# outcome is unknown (the channel's policy decides; ``lookup`` by default). 503 is not here:
# it is answered before the request is acted on.
WRITTEN_STATUS = frozenset({500, 502, 504})
# Codes of the create call that ask us to come back, whatever the HTTP status says.
RETRYABLE_CODES: Mapping[int, str] = {
    20429: "too many requests",
    21611: "the 'From' number's queue is full",
}
# Statuses of a listed message that mean Twilio has it and it has not failed.
DELIVERED_STATUSES = frozenset(
    {
        "accepted",
        "scheduled",
        "queued",
        "sending",
        "sent",
        "delivered",
        "read",
        "partially_delivered",
    }
)
FAILED_STATUSES = frozenset({"failed", "undelivered"})
CANCELED = "canceled"
INBOUND_STATUSES = frozenset({"receiving", "received"})
# Delivery errors, reported later in a failed/undelivered message's ``error_code``.
# Transient: the message did not reach the user and a new one may.
RESEND_CODES: Mapping[int, str] = {
    30001: "queue overflow",
    30003: "unreachable destination handset (switched off or out of coverage)",
    30008: "unknown error",
}
# Permanent: a new message would fail the same way. A code in neither table counts as this.
UNDELIVERABLE_CODES: Mapping[int, str] = {
    30002: "account suspended",
    30004: "message blocked (by the recipient or the carrier)",
    30005: "unknown destination handset",
    30006: "landline or unreachable carrier",
    30007: "message filtered by the carrier",
}

# Codes of an undelivered message whose recipient goes on the suppression list
# (delivery.guards.suppression): unsubscribed (STOP), and a handset that is unreachable, unknown
# or a landline. 30003 is transient for a lookup (RESEND_CODES), yet listed, as the receipts
# issue asks: a message type that must reach a briefly unreachable number says suppress = false.
SUPPRESSING_CODES = frozenset({21610, 30003, 30005, 30006})


def classify(response: httpx.Response) -> outcomes.Outcome:
    """Map one answer of the Messages API to an outcome (the table in the module docstring)."""
    status = response.status_code
    body = parse_json(response)
    if 200 <= status < 300:
        sid = body.get("sid") if isinstance(body, dict) else None
        if sid:
            return outcomes.Delivered(str(sid), status)
        return outcomes.Unknown("NO_PROVIDER_REF", f"HTTP {status} without a message sid", status)
    raw = body.get("code") if isinstance(body, dict) else None
    code = int(raw) if isinstance(raw, int) or (isinstance(raw, str) and raw.isdigit()) else None
    name = str(code) if code is not None else f"HTTP_{status}"
    message = body.get("message") if isinstance(body, dict) else None
    reason = (
        str(message)[:500]
        if message
        else (PERMANENT_CODES.get(code or 0) or f"HTTP {status} {response.reason_phrase}")
    )
    if code in PERMANENT_CODES:
        return outcomes.Permanent(name, reason, status)
    if code not in RETRYABLE_CODES and status in WRITTEN_STATUS:
        # The request reached Twilio and it failed while acting on it: the SMS may exist.
        return outcomes.Unknown(name, reason, status)
    if code in RETRYABLE_CODES or status in (408, 429) or (status >= 500 and status != 501):
        return outcomes.Retryable(
            name,
            reason,
            status,
            outcomes.parse_retry_after(response.headers.get("retry-after")),
            # refused before the create: too many requests, a full queue, unavailable
            created_nothing=code in RETRYABLE_CODES or status in (429, 503),
        )
    return outcomes.Permanent(name, reason, status)


def judge(
    matches: Sequence[Mapping[str, Any]], *, complete: bool = True, http_status: int = 200
) -> outcomes.LookupOutcome:
    """What the messages that match ours say (the lookup table in the module docstring).

    ``complete`` is false when the page budget ran out: only Found is then conclusive.
    """
    for message in matches:
        if message.get("status") in DELIVERED_STATUSES and message.get("sid"):
            return outcomes.Found(str(message["sid"]), http_status)
    strange = [m for m in matches if m.get("status") not in _KNOWN_STATUSES]
    if strange or not complete:
        status = strange[0].get("status") if strange else None
        return outcomes.LookupFailed(
            "LOOKUP_STATUS" if strange else "LOOKUP_BUDGET",
            f"a matching message has status {str(status)[:32]!r}, not one of Twilio's"
            if strange
            else "part of the list was not read",
            http_status,
        )
    for message in matches:
        sid = str(message.get("sid") or "")
        status = message.get("status")
        if status == CANCELED:
            return outcomes.Undeliverable(
                "CANCELED", f"message {sid} was canceled at Twilio", sid or None, http_status
            )
        code = _error_code(message.get("error_code"))
        if status in FAILED_STATUSES and code is not None and code not in RESEND_CODES:
            what = UNDELIVERABLE_CODES.get(code, "a delivery error not known to be transient")
            return outcomes.Undeliverable(
                str(code), f"message {sid} {status}: {what}", sid or None, http_status
            )
    return outcomes.Absent(http_status)


def _error_code(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


_KNOWN_STATUSES = DELIVERED_STATUSES | FAILED_STATUSES | INBOUND_STATUSES | {CANCELED}


def matches_ours(message: Mapping[str, Any], to: str, body: str) -> bool:
    text = message.get("body")
    return (
        message.get("to") == to
        and message.get("direction", "outbound-api") != "inbound"
        and message.get("status") not in INBOUND_STATUSES
        and isinstance(text, str)
        and bool(body)
        and (text == body or text.endswith(body))
    )


def parse_date(value: Any) -> dt.datetime | None:
    """Twilio's dates are RFC 2822 (``Thu, 24 Aug 2023 05:01:45 +0000``)."""
    if not isinstance(value, str):
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
