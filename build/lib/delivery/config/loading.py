"""Read settings from the environment and a TOML file, checking every value.

Environment:

- ``DELIVERY_DATABASE_URL``: SQLAlchemy URL of the outbox; ``postgres://`` and
  ``postgresql://`` get the installed driver (``postgresql+psycopg://``).
- ``DELIVERY_BROKER_URL``: Celery broker.
- ``DELIVERY_REDIS_URL``: Redis for shared state such as the circuit breaker (optional).

With none of these three set, the embedded default applies: a SQLite outbox and a file broker
in ``DELIVERY_HOME`` (``./.delivery``). Once one is set, the database and the broker must both
be: a half-configured process (say, an app with a database URL but no broker, which would
publish to a file no worker reads) fails at start-up with a ``ConfigError`` naming the missing
variable.
- ``DELIVERY_CONFIG``: path of a TOML file with the sections below (optional).

TOML (every section optional; unknown keys are errors that name the key)::

    [delivery]          # max_attempts, max_payload_bytes, relay_interval, relay_batch,
                        # dispatch_lease, send_lease, hold_lease, sweep_interval,
                        # max_countdown, batch_size, send_concurrency
    [backoff]           # base, cap (seconds)
    [timeouts]          # connect, write, read, pool (seconds), defaults for every provider
    [providers.NAME]    # kind = "http", base_url, api_key_env, [providers.NAME.timeouts],
                        # plus the adapter's own keys (config.options); kind is a built-in
                        # kind, an entry point or "package.module:Class" (delivery.providers)
    [providers.NAME.breaker]  # failure_rate, minimum_calls, consecutive_failures,
                              # failure_threshold, window, reset_timeout, half_open_probes,
                              # enabled, on_redis_error = "local" | "allow"
    [channels.NAME]     # NAME in sms | email | webhook; provider, on_unknown, max_attempts
    [types.NAME]        # channel, provider, on_unknown, max_attempts, priority, ttl, [backoff]

A provider's ``kind`` is resolved by ``delivery.providers.registry``, which also says which
extra keys its table takes. Nothing here reads ``os.environ`` at import time.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from delivery.config.settings import (
    CHANNELS,
    DEFAULT_HOME,
    DEFAULT_STUB_URL,
    ON_REDIS_ERROR,
    PRIORITIES,
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
from delivery.pipeline.policies import UnknownPolicy
from delivery.providers.registry import adapter_for

__all__ = [
    "REQUIRED_VARIABLES",
    "SERVICE_VARIABLES",
    "load_settings",
    "settings_from_mapping",
]

_TOP = {"delivery", "backoff", "timeouts", "providers", "channels", "types"}
_TUNING: dict[str, type] = {
    "max_attempts": int,
    "max_payload_bytes": int,
    "relay_interval": float,
    "relay_batch": int,
    "dispatch_lease": float,
    "send_lease": float,
    "hold_lease": float,
    "sweep_interval": float,
    "max_countdown": float,
    "batch_size": int,
    "send_concurrency": int,
}


#: ``dispatch_lease`` spans at least this many relay passes, each of which renews the leases of
#: tasks still queued: a pass may run late under load without a queued task being taken for lost.
LEASE_PER_RELAY = 3.0


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}{key}", "must be a table")
    return value


def _only(table: Mapping[str, Any], allowed: set[str] | Mapping[str, Any], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"{where}{key}", f"unknown key (expected one of {', '.join(sorted(allowed))})"
            )


def _number(value: Any, key: str, kind: type, minimum: float) -> Any:
    ok = isinstance(value, int) if kind is int else isinstance(value, int | float)
    if not ok or isinstance(value, bool):
        raise ConfigError(key, f"must be {'an integer' if kind is int else 'a number'}")
    if value < minimum:
        raise ConfigError(key, f"must be >= {minimum}")
    return kind(value)


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "must be a non-empty string")
    return value


def _timeouts(table: Mapping[str, Any], base: Timeouts, where: str) -> Timeouts:
    _only(table, set(Timeouts.__dataclass_fields__), where)
    values = {k: _number(v, f"{where}{k}", float, 0.001) for k, v in table.items()}
    return replace(base, **values)


def _policy(value: Any, key: str) -> UnknownPolicy:
    try:
        return UnknownPolicy(value)
    except ValueError:
        choices = ", ".join(p.value for p in UnknownPolicy)
        raise ConfigError(key, f"{value!r} is not a policy ({choices})") from None


def _breaker(table: Mapping[str, Any], where: str) -> BreakerConfig:
    _only(table, set(BreakerConfig.__dataclass_fields__), where)
    values: dict[str, Any] = {}
    for key, least in (
        ("minimum_calls", 1),
        ("half_open_probes", 1),
        ("consecutive_failures", 0),
        ("failure_threshold", 0),
    ):
        if key in table:
            values[key] = _number(table[key], f"{where}{key}", int, least)
    for key in ("window", "reset_timeout", "failure_rate"):
        if key in table:
            values[key] = _number(table[key], f"{where}{key}", float, 0.001)
            if not math.isfinite(values[key]):
                raise ConfigError(f"{where}{key}", "must be a finite number")
    if values.get("failure_rate", 0.0) > 1.0:
        raise ConfigError(f"{where}failure_rate", "must be <= 1 (a share of the calls: 0.5 is 50%)")
    if "enabled" in table:
        if not isinstance(table["enabled"], bool):
            raise ConfigError(f"{where}enabled", "must be true or false")
        values["enabled"] = table["enabled"]
    if "on_redis_error" in table:
        choice = table["on_redis_error"]
        if choice not in ON_REDIS_ERROR:
            raise ConfigError(
                f"{where}on_redis_error", f"{choice!r} is not one of {', '.join(ON_REDIS_ERROR)}"
            )
        values["on_redis_error"] = choice
    return BreakerConfig(**values)


def _provider(name: str, table: Mapping[str, Any], timeouts: Timeouts) -> ProviderConfig:
    where = f"providers.{name}."
    if "kind" not in table:
        raise ConfigError(f"{where}kind", "is required")
    adapter = adapter_for(_string(table["kind"], f"{where}kind"), f"{where}kind")
    common = {"kind", "base_url", "api_key_env", "timeouts", "breaker", "rate_limit"}
    _only(table, common | set(adapter.config_keys), where)
    base_url = adapter.default_base_url
    if "base_url" in table or base_url is None:
        if "base_url" not in table:
            raise ConfigError(f"{where}base_url", "is required")
        base_url = _string(table["base_url"], f"{where}base_url").rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}base_url", "must start with http:// or https://")
    api_key_env = table.get("api_key_env")
    if api_key_env is not None:
        api_key_env = _string(api_key_env, f"{where}api_key_env")
    timeouts = replace(timeouts, **adapter.default_timeouts)  # e.g. pigeon's read = 45
    own = _timeouts(_table(table, "timeouts", where), timeouts, f"{where}timeouts.")
    breaker = _breaker(_table(table, "breaker", where), f"{where}breaker.")
    options = adapter.options(table, where)
    rate_limit = table.get("rate_limit")
    if rate_limit is not None:
        rate_limit = _number(rate_limit, f"{where}rate_limit", float, 0.001)
    config = ProviderConfig(
        name, adapter.kind, base_url, own, api_key_env, breaker, options, rate_limit
    )
    adapter.check(config, where)
    return config


def _channel(name: str, table: Mapping[str, Any], providers: Mapping[str, Any]) -> ChannelConfig:
    where = f"channels.{name}."
    if name not in CHANNELS:
        raise ConfigError(
            f"channels.{name}", f"unknown channel (expected one of {', '.join(CHANNELS)})"
        )
    _only(table, {"provider", "on_unknown", "max_attempts"}, where)
    if "provider" not in table:
        raise ConfigError(f"{where}provider", "is required")
    provider = _string(table["provider"], f"{where}provider")
    if provider not in providers:
        raise ConfigError(f"{where}provider", f"{provider!r} is not a configured provider")
    adapter = adapter_for(providers[provider].kind)  # its default policy, e.g. twilio: lookup
    policy = _policy(table.get("on_unknown", adapter.default_on_unknown), f"{where}on_unknown")
    if policy is UnknownPolicy.LOOKUP and not adapter.supports_lookup:
        raise ConfigError(
            f"{where}on_unknown", f"provider {provider!r} ({adapter.kind}) has no lookup"
        )
    max_attempts = table.get("max_attempts")
    if max_attempts is not None:
        max_attempts = _number(max_attempts, f"{where}max_attempts", int, 1)
    return ChannelConfig(name, provider, policy, max_attempts)


def _backoff(table: Mapping[str, Any], where: str) -> Backoff:
    _only(table, {"base", "cap"}, where)
    backoff = Backoff(**{k: _number(v, f"{where}{k}", float, 0.0) for k, v in table.items()})
    if backoff.cap < backoff.base:
        raise ConfigError(f"{where}cap", f"must be >= {where}base")
    return backoff


def _message_type(
    name: str,
    table: Mapping[str, Any],
    channels: Mapping[str, ChannelConfig],
    providers: Mapping[str, ProviderConfig],
) -> MessageType:
    where = f"types.{name}."
    _only(table, set(MessageType.__dataclass_fields__) - {"name"}, where)
    if "channel" not in table:
        raise ConfigError(f"{where}channel", "is required")
    channel = _string(table["channel"], f"{where}channel")
    if channel not in channels:
        raise ConfigError(f"{where}channel", f"{channel!r} is not a configured channel")
    provider = table.get("provider")
    if provider is not None and _string(provider, f"{where}provider") not in providers:
        raise ConfigError(f"{where}provider", f"{provider!r} is not a configured provider")
    policy = table.get("on_unknown")
    priority = table.get("priority", "normal")
    if priority not in PRIORITIES:
        raise ConfigError(f"{where}priority", f"{priority!r} is not one of {', '.join(PRIORITIES)}")
    max_attempts, ttl = table.get("max_attempts"), table.get("ttl")
    return MessageType(
        name=name,
        channel=channel,
        provider=provider,
        on_unknown=None if policy is None else _policy(policy, f"{where}on_unknown"),
        max_attempts=None
        if max_attempts is None
        else _number(max_attempts, f"{where}max_attempts", int, 1),
        backoff=_backoff(table["backoff"], f"{where}backoff.") if "backoff" in table else None,
        priority=priority,
        ttl=None if ttl is None else _number(ttl, f"{where}ttl", float, 0.001),
    )


def settings_from_mapping(
    data: Mapping[str, Any],
    *,
    database_url: str,
    broker_url: str,
    redis_url: str | None,
    home: str = DEFAULT_HOME,
) -> Settings:
    """Build and validate settings from a parsed TOML document."""
    _only(data, _TOP, "")
    tuning = _table(data, "delivery", "")
    _only(tuning, _TUNING, "delivery.")
    values = {
        k: _number(v, f"delivery.{k}", _TUNING[k], 1 if _TUNING[k] is int else 0.01)
        for k, v in tuning.items()
    }
    backoff = _backoff(_table(data, "backoff", ""), "backoff.")
    timeouts = _timeouts(_table(data, "timeouts", ""), Timeouts(), "timeouts.")

    provider_tables = _table(data, "providers", "")
    channel_tables = _table(data, "channels", "")
    if not provider_tables:
        provider_tables = {"stub": {"kind": "http", "base_url": DEFAULT_STUB_URL}}
    providers = {
        name: _provider(name, _table(provider_tables, name, "providers."), timeouts)
        for name in provider_tables
    }
    if not channel_tables:
        first = next(iter(providers))
        channel_tables = {name: {"provider": first} for name in CHANNELS}
    channels = {
        name: _channel(name, _table(channel_tables, name, "channels."), providers)
        for name in channel_tables
    }
    type_tables = _table(data, "types", "")
    types = {
        name: _message_type(name, _table(type_tables, name, "types."), channels, providers)
        for name in type_tables
    }
    settings = Settings(
        database_url=database_url,
        broker_url=broker_url,
        redis_url=redis_url,
        providers=providers,
        channels=channels,
        types=types,
        backoff=backoff,
        home=home,
        **values,
    )
    if settings.hold_lease >= settings.send_lease:
        if "hold_lease" in values:
            raise ConfigError(
                "delivery.hold_lease",
                f"must be below delivery.send_lease ({settings.send_lease:g} s)",
            )
        settings = settings.with_(hold_lease=settings.send_lease / 2)  # a short send_lease
    if settings.dispatch_lease < LEASE_PER_RELAY * settings.relay_interval:
        raise ConfigError(
            "delivery.dispatch_lease",
            f"must be at least {LEASE_PER_RELAY:g} relay passes "
            f"({LEASE_PER_RELAY * settings.relay_interval:g} s at relay_interval "
            f"{settings.relay_interval:g} s): the relay renews queued tasks on each pass",
        )
    for provider in providers.values():
        if settings.send_lease <= provider.timeouts.total:
            raise ConfigError(
                "delivery.send_lease",
                f"must exceed provider {provider.name!r}'s total timeout "
                f"({provider.timeouts.total:g} s), or live sends would be taken for dead",
            )
    return settings


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the environment (and ``DELIVERY_CONFIG``'s TOML file) into validated settings.

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
