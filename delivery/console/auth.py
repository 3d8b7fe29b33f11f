"""Who may use the console: operators (change things) and viewers (read only).

``DELIVERY_CONSOLE_AUTH=user:password[,user:password]`` names the operators and is required;
``DELIVERY_CONSOLE_VIEWERS`` (same form) the read-only viewers. An error names the variable and
the entry, never the password. Requests authenticate with HTTP Basic, compared in constant time.

Every form that changes something carries ``csrf_token`` (``Csrf``), an HMAC of the user's name
under a key that lives as long as the console process: the browser sends HTTP Basic
credentials on every request, including one forged by another site; the token is what such a
request cannot know.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from delivery.errors import ConfigError

__all__ = ["AUTH_ENV", "MIN_PASSWORD", "VIEWERS_ENV", "Csrf", "Users", "parse_users"]

AUTH_ENV = "DELIVERY_CONSOLE_AUTH"
VIEWERS_ENV = "DELIVERY_CONSOLE_VIEWERS"
MIN_PASSWORD = 12


def _pairs(value: str, variable: str) -> dict[str, str]:
    users: dict[str, str] = {}
    for number, entry in enumerate(value.split(","), start=1):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, password = entry.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(variable, f"entry {number} is not user:password")
        if len(password) < MIN_PASSWORD:
            raise ConfigError(
                variable,
                f"the password of {name!r} is shorter than {MIN_PASSWORD} characters",
            )
        if name in users:
            raise ConfigError(variable, f"{name!r} is given twice")
        users[name] = password
    return users


@dataclass(frozen=True, slots=True)
class Users:
    """Operators and viewers by name, with their passwords."""

    operators: Mapping[str, str]
    viewers: Mapping[str, str] = field(default_factory=dict)

    def check(self, name: str, password: str) -> str | None:
        """``"operator"``, ``"viewer"``, or ``None`` for a wrong name or password."""
        for role, users in (("operator", self.operators), ("viewer", self.viewers)):
            expected = users.get(name)
            if expected is not None and hmac.compare_digest(expected.encode(), password.encode()):
                return role
        return None


def parse_users(environ: Mapping[str, str]) -> Users:
    """The console's users from the environment; ``ConfigError`` when there is no operator,
    a malformed entry, a short password, or a name in both lists."""
    operators = _pairs(environ.get(AUTH_ENV, ""), AUTH_ENV)
    if not operators:
        raise ConfigError(
            AUTH_ENV,
            "is not set: the console refuses to start without operators "
            f"(user:password, passwords of {MIN_PASSWORD}+ characters)",
        )
    viewers = _pairs(environ.get(VIEWERS_ENV, ""), VIEWERS_ENV)
    both = sorted(set(operators) & set(viewers))
    if both:
        raise ConfigError(VIEWERS_ENV, f"{both[0]!r} is also an operator")
    return Users(operators, viewers)


class Csrf:
    """Makes and checks the CSRF tokens of one console process."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def token(self, user: str) -> str:
        return hmac.new(self._key, f"csrf:{user}".encode(), hashlib.sha256).hexdigest()

    def valid(self, user: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.token(user), token or "")
