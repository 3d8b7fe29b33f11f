"""pydantic's validation errors as ``ConfigError``: the one place they are translated.

``config_error`` names the dotted key the user wrote and says what is wrong in the words every
setting uses (``config channels.sms.on_unknown: 'retyr' is not a policy (retry, lookup,
give_up)``, ``config timeouts.read: must be a finite number``). A validator that checks across
keys raises ``Invalid`` with the key to name, relative to the table it validates.
"""

from __future__ import annotations

import re

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from delivery.errors import ConfigError

__all__ = ["Invalid", "config_error"]


class Invalid(ValueError):
    """A check failed on ``key``, relative to the table whose validator raised it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key = key


_PROBLEMS = {
    "missing": "is required",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must be a non-empty string",
    "list_type": "must be a list",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "greater_than_equal": "must be >= {ge:g}",
    "less_than_equal": "must be <= {le:g}",
    "extra_forbidden": "unknown key",
}


def config_error(exc: ValidationError) -> ConfigError:
    """The first error of ``exc`` as one ``ConfigError`` naming its dotted key.

    One error, not all: a start-up failure is one line that names one key, and a process
    refuses to start on the first wrong value anyway (``delivery config check`` shows the next
    one once this one is fixed).
    """
    error: ErrorDetails = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"]]
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, ValueError):
        problem = str(cause)
        if isinstance(cause, Invalid):
            loc.append(cause.key)
    elif error["type"] in ("enum", "literal_error"):
        choices = ", ".join(re.findall(r"'([^']*)'", str(ctx["expected"])))
        what = f"a policy ({choices})" if loc[-1] == "on_unknown" else f"one of {choices}"
        problem = f"{error['input']!r} is not {what}"
    elif error["type"] in _PROBLEMS:
        problem = _PROBLEMS[error["type"]].format(**ctx)
    else:
        problem = error["msg"]
    return ConfigError(".".join(loc), problem)
