"""``DELIVERY_*`` settings from a web framework's configuration, falling back to the environment.

Each of ``ENV_KEYS`` is read from the framework's configuration, then from the environment, and
the database URL at last from the framework's own database setting (``default_database_url``),
so that the outbox lives in the app's database unless told otherwise. ``DELIVERY_OPTIONS`` may
hold the TOML file's sections as a mapping instead of ``DELIVERY_CONFIG``; giving both is an
error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from delivery.config.loading import load_settings, settings_from_mapping
from delivery.config.settings import Settings
from delivery.errors import ConfigError

__all__ = ["ENV_KEYS", "OPTIONS_KEY", "settings_from_config"]

ENV_KEYS = (
    "DELIVERY_DATABASE_URL",
    "DELIVERY_BROKER_URL",
    "DELIVERY_REDIS_URL",
    "DELIVERY_CONFIG",
    "DELIVERY_HOME",
)
OPTIONS_KEY = "DELIVERY_OPTIONS"


def settings_from_config(
    config: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    default_database_url: str | Callable[[], str] | None = None,
) -> Settings:
    """Validated settings from ``config`` (e.g. ``app.config``), then ``environ``.

    ``default_database_url`` (a URL, or a function called only when it is needed) is the
    outbox when neither names ``DELIVERY_DATABASE_URL``. Raises ``ConfigError`` naming the key
    on a wrong value.
    """
    env = os.environ if environ is None else environ
    merged: dict[str, str] = {}
    for name in ENV_KEYS:
        value = config.get(name)
        if value is None:
            value = env.get(name)
        if value is None and name == "DELIVERY_DATABASE_URL":
            value = (
                default_database_url() if callable(default_database_url) else default_database_url
            )
        if value is None:
            continue
        if not isinstance(value, str | os.PathLike):
            raise ConfigError(name, f"must be a string, not {type(value).__name__}")
        merged[name] = os.fspath(value)
    if merged.get("DELIVERY_DATABASE_URL") and not merged.get("DELIVERY_BROKER_URL"):
        where = "DELIVERY_DATABASE_URL" if _named(config, env) else "the app's own database"
        raise ConfigError(
            "DELIVERY_BROKER_URL",
            f"is not set while the outbox is {where}: set it (a worker must read the same "
            "outbox and broker; the embedded default applies only when nothing is configured)",
        )
    options = config.get(OPTIONS_KEY)
    if options is None:
        return load_settings(merged)
    if not isinstance(options, Mapping):
        raise ConfigError(OPTIONS_KEY, "must be a mapping with the TOML file's sections")
    if merged.get("DELIVERY_CONFIG"):
        raise ConfigError(OPTIONS_KEY, "give either DELIVERY_OPTIONS or DELIVERY_CONFIG, not both")
    base = load_settings(merged)
    return settings_from_mapping(
        options,
        database_url=base.database_url,
        broker_url=base.broker_url,
        redis_url=base.redis_url,
        home=base.home,
    )


def _named(config: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    return config.get("DELIVERY_DATABASE_URL") is not None or bool(env.get("DELIVERY_DATABASE_URL"))
