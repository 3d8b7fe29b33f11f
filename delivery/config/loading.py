"""Read settings from the environment and a TOML file, checking every value.

The variables are those of docs/configuration.md. With none of ``DELIVERY_DATABASE_URL``,
``DELIVERY_BROKER_URL`` and ``DELIVERY_REDIS_URL`` set, the embedded default applies: a
SQLite outbox and a file broker in ``DELIVERY_HOME``. Once one is set, the database and the
broker must both be: a half-configured process (say, an app with a database URL but no
broker, which would publish to a file no worker reads) fails at start-up with a
``ConfigError`` naming the missing variable.

The TOML file (``DELIVERY_CONFIG``) and every check on it are ``delivery.config.schema``'s;
this module reads the file and builds the frozen ``Settings`` from it. Nothing here reads
``os.environ`` at import time.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delivery.config.settings import (
    DEFAULT_FAILOVER_AFTER,
    DEFAULT_HOME,
    Backoff,
    BreakerConfig,
    ChannelConfig,
    MessageType,
    ProviderConfig,
    Settings,
    Timeouts,
)
from delivery.config.urls import database_url_for
from delivery.errors import ConfigError

if TYPE_CHECKING:
    from delivery.config.schema import ConfigFile

__all__ = [
    "REQUIRED_VARIABLES",
    "SERVICE_VARIABLES",
    "load_settings",
    "settings_from_mapping",
]


def settings_from_mapping(
    data: Mapping[str, Any],
    *,
    database_url: str,
    broker_url: str,
    redis_url: str | None,
    home: str = DEFAULT_HOME,
) -> Settings:
    """Build and validate settings from a parsed TOML document (``delivery.config.schema``)."""
    from delivery.config.schema import parse  # pydantic loads with the first settings, not import

    config = parse(data)
    tuning = config.delivery.model_dump()
    tuning["outcome_hooks"] = tuple(tuning["outcome_hooks"])
    if tuning["hold_lease"] >= tuning["send_lease"]:  # a short send_lease, hold_lease not set
        tuning["hold_lease"] = tuning["send_lease"] / 2
    return Settings(
        database_url=database_url,
        broker_url=broker_url,
        redis_url=redis_url,
        providers=_providers(config),
        channels={
            name: ChannelConfig(
                name,
                table.route[0],
                table.on_unknown or config.providers[table.route[0]].adapter.default_on_unknown,
                table.max_attempts,
                table.route,
                _failover_after(table.failover_after) or DEFAULT_FAILOVER_AFTER,
            )
            for name, table in config.channel_tables().items()
        },
        types={
            name: MessageType(
                name=name,
                **table.model_dump(exclude={"backoff", "provider", "providers", "failover_after"}),
                backoff=None if table.backoff is None else Backoff(**table.backoff.model_dump()),
                provider=table.route[0] if table.route else None,
                providers=table.route or None,
                failover_after=_failover_after(table.failover_after),
            )
            for name, table in config.types.items()
        },
        backoff=Backoff(**config.backoff.model_dump()),
        home=home,
        **tuning,
    )


def _failover_after(value: float | str | None) -> float | None:
    """A table's ``failover_after``: seconds, ``"never"`` (``math.inf``), or None (unset)."""
    if value is None:
        return None
    return math.inf if value == "never" else float(value)


def _providers(config: ConfigFile) -> dict[str, ProviderConfig]:
    """Each provider's settings, checked by its adapter's own ``check_config``."""
    timeouts = Timeouts(**config.timeouts.model_dump())
    providers = {}
    for name, table in config.providers.items():
        adapter = table.adapter
        provider = ProviderConfig(
            name=name,
            kind=adapter.kind,
            base_url=table.base_url or adapter.default_base_url or "",
            timeouts=table.timeouts_over(timeouts),
            api_key_env=table.api_key_env,
            breaker=BreakerConfig(**table.breaker.model_dump()),
            options=table.options(),
            rate_limit=table.rate_limit,
        )
        adapter.check(provider, f"providers.{name}.")
        providers[name] = provider
    return providers


def load_settings(environ: Mapping[str, str] | None = None, *, publishes: bool = True) -> Settings:
    """Read the environment (and ``DELIVERY_CONFIG``'s TOML file) into validated settings.

    ``publishes=False`` is for a process that never publishes a task (the receipt receiver,
    which faces the internet and so is given no broker password): ``DELIVERY_BROKER_URL`` may
    then be unset, and its settings carry ``memory://``.

    With nothing set this is the embedded default: a SQLite outbox and a file broker in
    ``./.delivery``, no Redis, and every channel sent to the stub provider on port 9090.
    """
    env = os.environ if environ is None else environ
    home = env.get("DELIVERY_HOME", DEFAULT_HOME)
    data: Mapping[str, Any] = {}
    path = env.get("DELIVERY_CONFIG")
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError("DELIVERY_CONFIG", f"file {path!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("DELIVERY_CONFIG", f"{path!r} is not valid TOML: {exc}") from None
    given = {name: env.get(name) or None for name in SERVICE_VARIABLES}
    if not any(given.values()):  # nothing configured: the embedded default
        database_url, broker_url = f"sqlite:///{home}/outbox.sqlite3", "filesystem://"
    else:
        for name in REQUIRED_VARIABLES:
            if name == "DELIVERY_BROKER_URL" and not publishes:
                given[name] = given[name] or "memory://"
            if given[name] is None:
                others = ", ".join(n for n, v in given.items() if v)
                raise ConfigError(
                    name,
                    f"is not set while {others} is: set it too (the embedded default, "
                    "a SQLite outbox and a file broker, applies only when none is set)",
                )
        database_url = database_url_for(str(given["DELIVERY_DATABASE_URL"]))
        broker_url = str(given["DELIVERY_BROKER_URL"])
    return settings_from_mapping(
        data,
        database_url=database_url,
        broker_url=broker_url,
        redis_url=given["DELIVERY_REDIS_URL"],
        home=home,
    )


#: The variables that name the services; with none set, the embedded default applies.
SERVICE_VARIABLES = ("DELIVERY_DATABASE_URL", "DELIVERY_BROKER_URL", "DELIVERY_REDIS_URL")
#: Once one of them is set, these must be too (Redis stays optional).
REQUIRED_VARIABLES = ("DELIVERY_DATABASE_URL", "DELIVERY_BROKER_URL")
