"""The stub's answers, the validation of its fault knobs (``PUT /_stub/faults``) and of its
receipts' knobs (``PUT /_stub/receipts``), and the receipts' body and signature."""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_FAULTS",
    "DEFAULT_RECEIPTS",
    "HTML",
    "HTML_503",
    "JSON",
    "MAX_BODY",
    "TEXT",
    "Answer",
    "ReceiptRule",
    "Rule",
    "compile_receipt_rules",
    "compile_rules",
    "dumps",
    "error",
    "provider_error",
    "receipt_body",
    "receipts_view",
    "sign_receipt",
    "validate_faults",
    "validate_receipts",
]

MAX_BODY = 1 << 20
JSON = "application/json"
HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"

DEFAULT_FAULTS: dict[str, Any] = {
    "drop_rate": 0.0,
    "delay_ms": 0,
    "error_rate": 0.0,
    "error_status": 503,
    "error_html": True,
    "retry_after": None,
    "fail_first": 0,
    "rules": {},
    "dedupe": True,
    "down": False,
    "seed": None,
}

DEFAULT_RECEIPTS: dict[str, Any] = {
    "url": None,
    "secret": None,
    "statuses": ["sent", "delivered"],
    "rules": {},
    "delay_ms": 0,
    "duplicate_rate": 0.0,
    "reorder": False,
    "never_rate": 0.0,
    "seed": None,
    "max_tries": 5,
    "retry_ms": 200,
}

RECEIPT_FINAL_STATUSES = ("delivered", "undelivered")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")

HTML_503 = (
    b"<!DOCTYPE html>\n<html><head><title>503 Service Unavailable</title></head>\n"
    b"<body><h1>503 Service Unavailable</h1>\n"
    b"<p>The server is temporarily unable to service your request. Please try again later.</p>\n"
    b"</body></html>\n"
)


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Rule(NamedTuple):
    status: int
    body: bytes
    content_type: str
    drop: bool = False
    """A 2xx rule only: take effect, then close the connection without answering."""


class Answer(NamedTuple):
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


def error(status: int, code: str, message: str | None = None) -> Answer:
    doc = {"code": code} if message is None else {"code": code, "message": message}
    return Answer(status, dumps(doc), JSON)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(cast(float, value))


def _rules(
    field: str, value: object, fields: set[str]
) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """Each (recipient, where, rule) of a ``rules`` map whose rules take only ``fields``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: must be an object mapping recipient -> rule")
    for recipient, rule in value.items():
        where = f"{field}[{recipient!r}]"
        if not isinstance(recipient, str):
            raise ValueError(f"{where}: recipient must be a string")
        if not isinstance(rule, Mapping):
            raise ValueError(f"{where}: rule must be an object")
        unknown = sorted(set(rule) - fields)
        if unknown:
            raise ValueError(f"{where}: unknown rule field {unknown[0]!r}")
        yield recipient, where, rule


def compile_rules(field: str, value: object) -> dict[str, Rule]:
    compiled: dict[str, Rule] = {}
    fields = {"status", "json", "body", "content_type", "drop"}
    for recipient, where, rule in _rules(field, value, fields):
        status = rule.get("status")
        if not is_int(status) or not 100 <= cast(int, status) <= 599:
            raise ValueError(f"{where}.status: must be an integer 100..599")
        drop = rule.get("drop", False)
        if not isinstance(drop, bool) or (drop and not 200 <= cast(int, status) < 300):
            raise ValueError(f"{where}.drop: must be true or false, and only on a 2xx rule")
        if "json" in rule and "body" in rule:
            raise ValueError(f"{where}: give either 'json' or 'body', not both")
        content_type = rule.get("content_type")
        if content_type is not None and not isinstance(content_type, str):
            raise ValueError(f"{where}.content_type: must be a string")
        if "json" in rule:
            try:
                body, default = dumps(rule["json"]), JSON
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}.json: not JSON-serialisable ({exc})") from None
        else:
            text = rule.get("body", "")
            if not isinstance(text, str):
                raise ValueError(f"{where}.body: must be a string")
            body, default = text.encode(), TEXT
        compiled[recipient] = Rule(cast(int, status), body, content_type or default, drop)
    return compiled


def validate_faults(updates: Mapping[str, Any]) -> dict[str, Any]:
    """Return normalised copies of ``updates``; raise ValueError naming the bad field."""
    clean: dict[str, Any] = {}
    for field, value in updates.items():
        if field not in DEFAULT_FAULTS:
            raise ValueError(f"unknown fault field: {field!r}")
        if field in ("drop_rate", "error_rate"):
            if not is_number(value) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{field}: must be a number between 0 and 1")
            value = float(value)
        elif field in ("delay_ms", "fail_first"):
            if not is_int(value) or value < 0:
                raise ValueError(f"{field}: must be a non-negative integer")
        elif field == "error_status":
            if not is_int(value) or not 400 <= value <= 599:
                raise ValueError(f"{field}: must be an integer 400..599")
        elif field in ("error_html", "dedupe", "down"):
            if not isinstance(value, bool):
                raise ValueError(f"{field}: must be a boolean")
        elif field == "retry_after":
            if value is not None and (not is_number(value) or value < 0):
                raise ValueError(f"{field}: must be a non-negative number or null")
        elif field == "seed":
            if value is not None and not is_int(value) and not isinstance(value, str):
                raise ValueError(f"{field}: must be an integer, a string or null")
        else:  # rules
            compile_rules(field, value)
            value = copy.deepcopy(dict(value))
        clean[field] = value
    return clean


def provider_error(faults: Mapping[str, Any]) -> Answer:
    status: int = faults["error_status"]
    retry_after = faults["retry_after"]
    headers: tuple[tuple[str, str], ...] = ()
    if retry_after is not None:
        seconds = int(retry_after) if float(retry_after).is_integer() else retry_after
        headers = (("Retry-After", str(seconds)),)
    if status == 503 and faults["error_html"]:
        return Answer(status, HTML_503, HTML, headers)
    code = "RATE_LIMITED" if status == 429 else "PROVIDER_ERROR"
    return Answer(status, dumps({"code": code}), JSON, headers)


class ReceiptRule(NamedTuple):
    """The final status of a recipient's receipts, and its code."""

    status: str
    code: str | None


def compile_receipt_rules(field: str, value: object) -> dict[str, ReceiptRule]:
    compiled: dict[str, ReceiptRule] = {}
    for recipient, where, rule in _rules(field, value, {"status", "code"}):
        status = rule.get("status")
        if status not in RECEIPT_FINAL_STATUSES:
            raise ValueError(f"{where}.status: must be 'delivered' or 'undelivered'")
        code = rule.get("code")
        if code is not None and not isinstance(code, str):
            raise ValueError(f"{where}.code: must be a string or null")
        compiled[recipient] = ReceiptRule(cast(str, status), code)
    return compiled


def validate_receipts(updates: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """Return normalised copies of ``updates``; raise ValueError naming the bad field. A ``url``
    needs a ``secret`` (in ``updates`` or already in ``current``)."""
    clean: dict[str, Any] = {}
    for field, value in updates.items():
        if field not in DEFAULT_RECEIPTS:
            raise ValueError(f"unknown receipts field: {field!r}")
        if field == "url":
            if value is not None:
                try:
                    parts = urlsplit(value) if isinstance(value, str) else None
                    _ = parts and parts.port  # an invalid port raises ValueError
                except ValueError:
                    parts = None
                if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
                    raise ValueError(f"{field}: must be an http(s) URL or null")
        elif field == "secret":
            if value is not None:
                rest = value.removeprefix("whsec_") if isinstance(value, str) else ""
                try:
                    key = base64.b64decode(rest + "==") if _BASE64.fullmatch(rest) else b""
                except binascii.Error:
                    key = b""
                if not key or not value.startswith("whsec_"):
                    raise ValueError(f"{field}: must be 'whsec_' + non-empty base64, or null")
        elif field == "statuses":
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(status, str) and status for status in value)
            ):
                raise ValueError(f"{field}: must be a non-empty list of non-empty strings")
            value = list(value)
        elif field in ("duplicate_rate", "never_rate"):
            if not is_number(value) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{field}: must be a number between 0 and 1")
            value = float(value)
        elif field in ("delay_ms", "retry_ms"):
            if not is_int(value) or value < 0:
                raise ValueError(f"{field}: must be a non-negative integer")
        elif field == "max_tries":
            if not is_int(value) or value < 1:
                raise ValueError(f"{field}: must be an integer >= 1")
        elif field == "reorder":
            if not isinstance(value, bool):
                raise ValueError(f"{field}: must be a boolean")
        elif field == "seed":
            if value is not None and not is_int(value) and not isinstance(value, str):
                raise ValueError(f"{field}: must be an integer, a string or null")
        else:  # rules
            compile_receipt_rules(field, value)
            value = copy.deepcopy(dict(value))
        clean[field] = value
    merged = {**current, **clean}
    if merged["url"] is not None and merged["secret"] is None:
        raise ValueError("secret: required when url is set")
    return clean


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def receipts_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """The receipts' config as the control API shows it: ``secret`` and the recipients of
    ``rules`` as sha256 hex (the secret is never shown, nor a recipient)."""
    view = copy.deepcopy(dict(config))
    if view["secret"] is not None:
        view["secret"] = _sha256(view["secret"])
    view["rules"] = {_sha256(recipient): rule for recipient, rule in view["rules"].items()}
    return view


def _iso_ms(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def receipt_body(msg_id: str, key: str, status: str, code: str | None, at_ms: int) -> bytes:
    """One receipt's JSON body; ``at_ms`` is the provider's event time in Unix milliseconds."""
    doc = {"id": msg_id, "idempotency_key": key, "status": status, "code": code}
    return dumps({**doc, "at": _iso_ms(at_ms)})


def sign_receipt(secret: str, event: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header (Standard Webhooks, ``v1``) of one POST of a receipt."""
    key = base64.b64decode(secret.removeprefix("whsec_") + "==")
    digest = hmac.new(key, f"{event}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()
