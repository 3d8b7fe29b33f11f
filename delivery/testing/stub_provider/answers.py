"""The stub's answers and the validation of its fault knobs (``PUT /_stub/faults``)."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple, cast

__all__ = [
    "DEFAULT_FAULTS",
    "HTML",
    "HTML_503",
    "JSON",
    "MAX_BODY",
    "TEXT",
    "Answer",
    "Rule",
    "compile_rules",
    "dumps",
    "error",
    "provider_error",
    "validate_faults",
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
    "seed": None,
}

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


def compile_rules(field: str, value: object) -> dict[str, Rule]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: must be an object mapping recipient -> rule")
    compiled: dict[str, Rule] = {}
    for recipient, rule in value.items():
        where = f"{field}[{recipient!r}]"
        if not isinstance(recipient, str):
            raise ValueError(f"{where}: recipient must be a string")
        if not isinstance(rule, Mapping):
            raise ValueError(f"{where}: rule must be an object")
        unknown = sorted(set(rule) - {"status", "json", "body", "content_type", "drop"})
        if unknown:
            raise ValueError(f"{where}: unknown rule field {unknown[0]!r}")
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
        elif field in ("error_html", "dedupe"):
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
