"""Provider adapters, found by ``kind`` in the registry."""

from __future__ import annotations

from collections.abc import Callable

from delivery.config import ProviderConfig
from delivery.errors import ConfigError
from delivery.providers.base import Envelope, Provider
from delivery.providers.http import HttpProvider

__all__ = ["REGISTRY", "Envelope", "HttpProvider", "Provider", "build_provider"]

REGISTRY: dict[str, Callable[[ProviderConfig], Provider]] = {"http": HttpProvider}


def build_provider(config: ProviderConfig) -> Provider:
    try:
        factory = REGISTRY[config.kind]
    except KeyError:
        raise ConfigError(
            f"providers.{config.name}.kind", f"no adapter for kind {config.kind!r}"
        ) from None
    return factory(config)
