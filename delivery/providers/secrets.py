"""Start-up check of the providers' secrets: a missing one fails the worker at start, loudly,
instead of killing every message at send time.

A provider's secrets are named by environment variables: ``api_key_env`` (every kind) and
each of its own keys whose name ends with ``_env`` (``auth_token_env`` for Twilio,
``secret_env`` for webhooks, ...), but for the receipts' (``RECEIVER_SECRETS``): a worker
never reads those, and ``delivery receiver`` checks them at its own start
(``delivery.receipts.protocols``), so a worker never needs them. ``check_secrets`` raises one
``ConfigError`` naming every dotted key whose variable is unset or empty; it names variables,
never their values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from delivery.config.settings import Settings
from delivery.errors import ConfigError

__all__ = ["RECEIVER_SECRETS", "check_secrets"]

RECEIVER_SECRETS = frozenset({"receipt_secret_env"})
"""The keys naming a secret only the receipt receiver reads."""


def check_secrets(settings: Settings, environ: Mapping[str, str] | None = None) -> None:
    """Raise ``ConfigError`` if any configured provider lacks a secret (see the docstring)."""
    env = os.environ if environ is None else environ
    missing: list[tuple[str, str]] = []
    for config in settings.providers.values():
        named = [("api_key_env", config.api_key_env), *sorted(config.options.items())]
        missing += [
            (f"providers.{config.name}.{key}", var)
            for key, var in named
            if key.endswith("_env")
            and key not in RECEIVER_SECRETS
            and isinstance(var, str)
            and var
            and not env.get(var, "").strip()
        ]
    if missing:
        (key, var), others = missing[0], missing[1:]
        also = "".join(f"; also {k}: {v}" for k, v in others)
        raise ConfigError(key, f"environment variable {var} is unset or empty{also}")
