"""CSRF tokens: every form that changes something carries ``csrf_token``, an HMAC of the
user's name under a key that lives as long as the console process.

HTTP Basic credentials are sent by the browser on every request, including one forged by
another site; the token is what such a request cannot know.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["Csrf"]


class Csrf:
    """Makes and checks the tokens of one console process."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def token(self, user: str) -> str:
        return hmac.new(self._key, f"csrf:{user}".encode(), hashlib.sha256).hexdigest()

    def valid(self, user: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.token(user), token or "")
