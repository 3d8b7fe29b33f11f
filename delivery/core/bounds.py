"""Bounds on what comes from outside: the one place provider text becomes storable.

A provider (or a webhook receiver, which may be an attacker) controls status codes, headers
and bodies. Everything of theirs that we keep or print passes through here: control, format
and surrogate characters become spaces, the message's recipient and anything shaped like a
phone number or an email address is masked (G6: a provider's text that names the recipient
never reaches a log, an exception or the CLI; in a provider reference, which may be all
digits, only the recipient is), each value is cut to its column, and a requested wait is
clamped. The outcome classes (``delivery.core.outcomes``) apply these on construction;
``delivery.providers.calls`` adds the message's own recipient.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "CODE_LENGTH",
    "MAX_RETRY_AFTER",
    "REASON_LENGTH",
    "REF_LENGTH",
    "code",
    "delay",
    "mask",
    "printable",
    "ref",
    "text",
    "unrecipient",
]

CODE_LENGTH = 64  # delivery_messages.last_error_code, delivery_attempts.error_code
REF_LENGTH = 255  # delivery_messages.provider_ref
REASON_LENGTH = 500  # delivery_messages.last_error, delivery_attempts.error (text, bounded here)
MAX_RETRY_AFTER = 86400.0  # one day: the longest wait a provider may ask for

# C0, DEL, C1, zero-width and bidi controls, BOM, line/paragraph separators, surrogates.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]"
)
_EMAIL = re.compile(r"[^\s@<>\"]+@[^\s@<>\"]+")
# A phone number in any common spelling: +1 (201) 555-0123, 0044 20 7946 0958, 2015550123.
_NUMBER = re.compile(r"(?<![A-Za-z0-9])(?:\+|00)?\(?\d(?:[\s().\-/]{0,2}\d){6,}(?![A-Za-z0-9])")


def printable(value: str) -> str:
    """``value`` with every control, format or surrogate character replaced by a space."""
    return _CONTROL.sub(" ", value)


def _cut(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: max(limit - 1, 0)] + "…"


def _generic(value: str) -> str:
    return _NUMBER.sub("[number]", _EMAIL.sub("[email]", value))


def mask(value: str, recipient: str | None = None) -> str:
    """``value`` with ``recipient``, email addresses and phone numbers masked.

    The recipient is looked for as given, without its ``+``, and as the masks above would
    have left it (an outcome masks numbers and emails when it is built, before the pipeline
    adds its recipient: ``https://h.example/u/[number]`` is still that webhook's URL)."""
    return _generic(unrecipient(value, recipient))


def unrecipient(value: str, recipient: str | None) -> str:
    """``value`` with only ``recipient`` masked (in the forms ``mask`` looks for): for a
    provider's reference, where any other number may be the reference itself."""
    if recipient:
        forms = {recipient, recipient.lstrip("+")}
        forms |= {_generic(form) for form in forms}
        for form in sorted(forms, key=len, reverse=True):
            if len(form) >= 3 and form not in ("[number]", "[email]"):
                value = re.sub(re.escape(form), "[recipient]", value, flags=re.IGNORECASE)
    return value


def text(value: object, limit: int = REASON_LENGTH, recipient: str | None = None) -> str:
    """Provider text made storable and printable: no control characters, recipients masked,
    at most ``limit`` characters."""
    raw = value if isinstance(value, str) else str(value)
    # Cut generously before masking (bounded work), precisely after (a mask never splits).
    cleaned = printable(raw[: limit * 4 + 64]).strip()
    return _cut(mask(cleaned, recipient), limit)


def code(value: object, recipient: str | None = None) -> str:
    """An error code that fits its columns (``CODE_LENGTH``)."""
    return text(value, CODE_LENGTH, recipient) or "EMPTY_CODE"


def ref(value: object) -> str | None:
    """A provider reference that fits its column, or ``None`` when nothing is left of it."""
    if value is None:
        return None
    cleaned = printable(str(value)[: REF_LENGTH * 2]).strip()
    return _cut(cleaned, REF_LENGTH) or None


def delay(seconds: float | None) -> float | None:
    """A requested wait clamped to ``0 .. MAX_RETRY_AFTER`` seconds; ``None`` if not a number."""
    if seconds is None:
        return None
    try:
        value = float(seconds)
    except (TypeError, ValueError, OverflowError):
        return None
    if math.isnan(value):
        return None
    return min(max(value, 0.0), MAX_RETRY_AFTER)
