"""Start-up check of the providers' secrets: a missing one fails the worker at start, loudly,
instead of killing every message at send time.

A provider's secrets are named by environment variables: ``api_key_env`` (every kind) and
each of its own keys whose name ends with ``_env`` (``auth_token_env`` for Twilio,
``secret_env`` for webhooks, ...). ``check_secrets`` raises one ``ConfigError`` naming every
dotted key whose variable is unset or empty; it names variables, never their values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from delivery.config.settings import ProviderConfig, Settings
from delivery.errors import ConfigError

__all__ = ["check_secrets", "missing_secrets"]


def missing_secrets(
    config: ProviderConfig, environ: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """``(dotted key, variable)`` for each secret of ``config`` that is unset or empty."""
    env = os.environ if environ is None else environ
    named: list[tuple[str, str]] = []
    if config.api_key_env:
        named.append(("api_key_env", config.api_key_env))
    for key, value in sorted(config.options.items()):
        if key.endswith("_env") and isinstance(value, str) and value:
            named.append((key, value))
    where = f"providers.{config.name}."
    return [(where + key, var) for key, var in named if not env.get(var, "").strip()]


def check_secrets(settings: Settings, environ: Mapping[str, str] | None = None) -> None:
    """Raise ``ConfigError`` if any configured provider lacks a secret (see the docstring)."""
    missing = [
        item for config in settings.providers.values() for item in missing_secrets(config, environ)
    ]
    if missing:
        (key, var), others = missing[0], missing[1:]
        also = "".join(f"; also {k}: {v}" for k, v in others)
        raise ConfigError(key, f"environment variable {var} is unset or empty{also}")
