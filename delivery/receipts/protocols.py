"""Each provider's receipt protocol, built from the settings: the reference protocol's for
kind ``http`` (``receipt_secret_env``; ``delivery.receipts.standard``) and Twilio's for kind
``twilio`` (``status_callback_url``; ``delivery.receipts.twilio``). A provider without those
keys has no receipts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

from delivery.config.settings import ProviderConfig, Settings
from delivery.errors import ConfigError
from delivery.receipts.standard import StandardReceipts
from delivery.receipts.twilio import TwilioReceipts
from delivery.transitions.receipts import ReceiptEvent

__all__ = ["ReceiptProtocol", "protocols"]


class ReceiptProtocol(Protocol):
    provider: str
    #: The codes of an ``undelivered`` receipt that put its recipient on the suppression list.
    suppressing: frozenset[str]

    def read(self, body: bytes, headers: Mapping[str, str], query: str) -> ReceiptEvent:
        """The receipt of a request (``body``, ``headers`` with names in lower case, the
        query string as it arrived); ``SignatureRefused`` or ``InvalidReceipt`` if it is not
        one."""
        ...


def protocols(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> dict[str, ReceiptProtocol]:
    """The receipt protocol of every provider that has receipts, by name; ``ConfigError``
    naming the key whose variable is unset or not a secret."""
    env = os.environ if environ is None else environ
    found: dict[str, ReceiptProtocol] = {}
    for name, config in sorted(settings.providers.items()):
        if config.kind == "http" and "receipt_secret_env" in config.options:
            setting = f"providers.{name}.receipt_secret_env"
            found[name] = StandardReceipts(
                name, setting, _secret(config, "receipt_secret_env", env)
            )
        elif config.kind == "twilio" and "status_callback_url" in config.options:
            url = str(config.options["status_callback_url"])
            found[name] = TwilioReceipts(name, url, _secret(config, "auth_token_env", env))
    return found


def _secret(config: ProviderConfig, key: str, env: Mapping[str, str]) -> str:
    variable = str(config.options[key])
    secret = env.get(variable, "").strip()
    if not secret:
        raise ConfigError(
            f"providers.{config.name}.{key}", f"environment variable {variable} is unset or empty"
        )
    return secret
