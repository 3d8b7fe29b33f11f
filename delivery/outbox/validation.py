"""Checks on ``enqueue``'s input. Each failure raises ``InvalidMessage`` naming the field; a
recipient is never echoed in the error (it would reach the caller's logs).

An SMS recipient is accepted only when it already is the E.164 form of a number
``phonenumbers`` finds valid; anything else gets the one error ``SMS_RECIPIENT``. The answer
is cached per input string: parsing is most of ``enqueue``'s own work, and an app sends to the
same numbers again. Importing this module calls ``phonenumbers.enable_pattern_cache()``: the
library keeps the patterns it compiled instead of leaving them to ``re``'s bounded cache,
which numbers from many regions overflow (every check then recompiles)."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import phonenumbers
from email_validator import EmailNotValidError, validate_email

from delivery.core import bounds
from delivery.errors import InvalidMessage

__all__ = [
    "SMS_RECIPIENT",
    "canonical_json",
    "check_key",
    "check_payload",
    "check_recipient",
    "check_send_at",
    "checked_payload",
    "payload_digest",
    "payload_hash",
]

MAX_KEY_LENGTH = 255
_BODY_FIELDS = {"sms": ("body",), "email": ("body", "html", "text", "template")}


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, no NaN. Raises InvalidMessage."""
    try:
        return _CANONICAL.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage("payload", f"is not JSON-serialisable: {exc}") from None


def payload_hash(channel: str, to: str, payload: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``{"channel", "to", "payload"}``: what binds a key."""
    return payload_digest(channel, to, canonical_json(payload))


def payload_digest(channel: str, to: str, payload_json: str) -> str:
    """``payload_hash`` from the payload's canonical JSON, already made (``checked_payload``):
    the document is the same string, its keys in sorted order (channel, payload, to)."""
    channel_json, to_json = canonical_json(channel), canonical_json(to)
    document = f'{{"channel":{channel_json},"payload":{payload_json},"to":{to_json}}}'
    return hashlib.sha256(document.encode()).hexdigest()


#: A key every check below accepts: printable ASCII, no space at either end, within the limit.
_PLAIN_KEY = re.compile(rf"[!-~](?:[ -~]{{0,{MAX_KEY_LENGTH - 2}}}[!-~])?")


def check_key(key: Any) -> str:
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return key
    if not isinstance(key, str) or not key:
        raise InvalidMessage("key", "must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidMessage("key", f"is {len(key)} characters; the limit is {MAX_KEY_LENGTH}")
    if "\x00" in key:
        raise InvalidMessage("key", "must not contain NUL characters")
    # The key goes out as an HTTP header (Idempotency-Key) on every attempt: a character a
    # header cannot carry would make every attempt fail, so refuse it before anything is written.
    bad = next((ch for ch in key if not " " <= ch <= "~"), None)
    if bad is not None:
        raise InvalidMessage(
            "key", f"contains {bad!r}: keys are sent as an HTTP header, so printable ASCII only"
        )
    if key[0] == " " or key[-1] == " ":
        raise InvalidMessage("key", "must not start or end with a space (HTTP would drop it)")
    return key


def check_send_at(send_at: Any, now: dt.datetime) -> dt.datetime:
    if send_at is None:
        return now
    if not isinstance(send_at, dt.datetime):
        raise InvalidMessage("send_at", "must be a datetime")
    if send_at.tzinfo is None or send_at.utcoffset() is None:
        raise InvalidMessage("send_at", "must be timezone-aware (e.g. datetime.now(UTC))")
    return send_at.astimezone(dt.UTC)


#: The one error for an SMS recipient that is not accepted, whatever is wrong with it.
SMS_RECIPIENT = (
    "is not a valid phone number in international form "
    "(E.164: +, country code and number, digits only, like +14155550123)"
)
#: An E.164 form has at most 21 characters (+, a code of 1 to 3 digits, at most 17 more):
#: longer input is still asked of the library, but not kept in the cache.
_CACHED_LENGTH = 32


def _is_e164(to: str) -> bool:
    """True when ``phonenumbers`` finds ``to`` a valid number and ``to`` is its E.164 form."""
    try:
        number = phonenumbers.parse(to, None)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(number) and (
        phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164) == to
    )


_is_e164_cached = functools.lru_cache(maxsize=4096)(_is_e164)
phonenumbers.enable_pattern_cache()


def check_recipient(channel: str, to: Any) -> str:
    """The recipient in its canonical form for ``channel``."""
    if channel == "sms":
        if isinstance(to, str) and (
            _is_e164_cached(to) if len(to) <= _CACHED_LENGTH else _is_e164(to)
        ):
            return to
        raise InvalidMessage("to", SMS_RECIPIENT)
    if not isinstance(to, str) or not to.strip():
        raise InvalidMessage("to", "must be a non-empty string")
    if channel == "email":
        try:
            return str(validate_email(to, check_deliverability=False).normalized)
        except EmailNotValidError as exc:
            problem = bounds.mask(str(exc), to)
            for part in to.rpartition("@")[::2]:  # validators quote a part of the address
                problem = problem.replace(part, "[recipient]") if len(part) >= 3 else problem
            raise InvalidMessage("to", f"is not an email address: {problem}") from None
    if channel == "webhook":
        parts = urlsplit(to)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidMessage("to", "is not an http(s) URL")
        if parts.username or parts.password:
            raise InvalidMessage("to", "webhook URLs must not carry credentials")
        return to
    raise InvalidMessage("channel", f"{channel!r} has no recipient rules")


def check_payload(channel: str, payload: Any, limit: int) -> dict[str, Any]:
    return checked_payload(channel, payload, limit)[0]


def checked_payload(channel: str, payload: Any, limit: int) -> tuple[dict[str, Any], str]:
    """``check_payload``'s checks; the payload and its canonical JSON."""
    if not isinstance(payload, Mapping):
        raise InvalidMessage("payload", "must be a JSON object (a dict)")
    document = canonical_json(payload)
    encoded = document.encode()
    if len(encoded) > limit:
        raise InvalidMessage("payload", f"is {len(encoded)} bytes; the limit is {limit}")
    fields = _BODY_FIELDS.get(channel)
    if fields is None:
        if not payload:
            raise InvalidMessage("payload", "is empty")
    elif not any(isinstance(payload.get(f), str | dict) and payload.get(f) for f in fields):
        raise InvalidMessage(
            "payload.body", f"is empty (a {channel} needs one of {', '.join(fields)})"
        )
    return dict(payload), document
