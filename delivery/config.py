"""Settings: one typed object built at start-up from the environment and a TOML file.

Environment:

- ``DELIVERY_DATABASE_URL``: SQLAlchemy URL of the outbox (default: SQLite in ``./.delivery``).
- ``DELIVERY_BROKER_URL``: Celery broker (default: a file broker in ``./.delivery/broker``).
- ``DELIVERY_REDIS_URL``: Redis for shared state such as the circuit breaker (optional).
- ``DELIVERY_CONFIG``: path of a TOML file with the sections below (optional).

TOML (every section optional; unknown keys are errors that name the key)::

    [delivery]          # max_attempts, max_payload_bytes, relay_interval, relay_batch,
                        # dispatch_lease, send_lease, sweep_interval, max_countdown
    [backoff]           # base, cap (seconds)
    [timeouts]          # connect, write, read, pool (seconds), defaults for every provider
    [providers.NAME]    # kind = "http", base_url, api_key_env, [providers.NAME.timeouts],
                        # plus the adapter's own keys (config.options); kind is a built-in
                        # kind, an entry point or "package.module:Class" (delivery.providers)
    [providers.NAME.breaker]  # failure_threshold, window, reset_timeout, success_threshold,
                              # on_redis_error = "local" | "allow"
    [channels.NAME]     # NAME in sms | email | webhook; provider, on_unknown, max_attempts

Nothing here reads ``os.environ`` at import time.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from delivery.errors import ConfigError
from delivery.policies import UnknownPolicy

__all__ = [
    "CHANNELS",
    "ON_REDIS_ERROR",
    "PRIORITIES",
    "PROVIDER_KINDS",
    "Backoff",
    "BreakerConfig",
    "ChannelConfig",
    "MessageType",
    "ProviderConfig",
    "Settings",
    "Timeouts",
    "load_settings",
]

CHANNELS = ("email", "sms", "webhook")
PROVIDER_KINDS = ("http", "pigeon", "twilio", "webhook")  # built in; see delivery.providers
ON_REDIS_ERROR = ("local", "allow")
DEFAULT_HOME = ".delivery"
DEFAULT_STUB_URL = "http://127.0.0.1:9090"


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-phase HTTP timeouts in seconds (httpx's connect / write / read / pool)."""

    connect: float = 3.0
    write: float = 5.0
    read: float = 10.0
    pool: float = 5.0

    @property
    def total(self) -> float:
        return self.connect + self.write + self.read + self.pool


@dataclass(frozen=True, slots=True)
class Backoff:
    """Full-jitter backoff: delay ~ U(0, min(cap, base * 2**attempt))."""

    base: float = 1.0
    cap: float = 300.0


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """A provider's circuit breaker (``delivery.breaker``); defaults from seed 001.

    ``failure_threshold`` transient failures inside ``window`` seconds open it; after
    ``reset_timeout`` seconds one probe may go; ``success_threshold`` probe successes close
    it. ``on_redis_error``: ``local`` (each process keeps its own breaker while Redis is
    unreachable) or ``allow`` (send without a breaker meanwhile).
    """

    failure_threshold: int = 5
    window: float = 60.0
    reset_timeout: float = 30.0
    success_threshold: int = 2
    on_redis_error: str = "local"


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    name: str
    kind: str
    base_url: str
    timeouts: Timeouts
    api_key_env: str | None = None
    breaker: BreakerConfig = BreakerConfig()
    options: Mapping[str, Any] = field(default_factory=dict)  # the adapter's own keys
    rate_limit: float | None = None  # messages per second, shared by every worker

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The secret, read from the environment when needed; never stored in settings."""
        if self.api_key_env is None:
            return None
        return (os.environ if environ is None else environ).get(self.api_key_env)


@dataclass(frozen=True, slots=True)
class MessageType:
    """Defaults for one kind of message (``otp``, ``receipt``, ``marketing``), chosen with
    ``enqueue(..., type="otp")``; explicit arguments to ``enqueue`` win.

    ``priority`` picks the Celery queue (``urgent`` -> ``delivery.urgent``, ``bulk`` ->
    ``delivery.bulk``, ``normal`` -> ``delivery``); ``ttl`` (seconds from the due time) is how
    long the message is worth sending: past it, it ends ``expired`` instead of going out late.
    """

    name: str
    channel: str
    provider: str | None = None
    on_unknown: UnknownPolicy | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    priority: str = "normal"
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    name: str
    provider: str
    on_unknown: UnknownPolicy = UnknownPolicy.RETRY
    max_attempts: int | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str
    broker_url: str
    redis_url: str | None = None
    providers: Mapping[str, ProviderConfig] = field(default_factory=dict)
    channels: Mapping[str, ChannelConfig] = field(default_factory=dict)
    types: Mapping[str, MessageType] = field(default_factory=dict)
    backoff: Backoff = Backoff()
    max_attempts: int = 8
    max_payload_bytes: int = 64 * 1024
    relay_interval: float = 1.0
    relay_batch: int = 500
    dispatch_lease: float = 120.0
    send_lease: float = 60.0
    sweep_interval: float = 5.0
    max_countdown: float = 300.0
    home: str = DEFAULT_HOME

    def channel(self, name: str) -> ChannelConfig | None:
        return self.channels.get(name)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)


_TOP = {"delivery", "backoff", "timeouts", "providers", "channels", "types"}
PRIORITIES = ("urgent", "normal", "bulk")
_TUNING: dict[str, type] = {
    "max_attempts": int,
    "max_payload_bytes": int,
    "relay_interval": float,
    "relay_batch": int,
    "dispatch_lease": float,
    "send_lease": float,
    "sweep_interval": float,
    "max_countdown": float,
}


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}{key}", "must be a table")
    return value


def _only(table: Mapping[str, Any], allowed: set[str] | Mapping[str, Any], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}{key}", f"unknown key (expected one of {sorted(allowed)})")


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
    for key in ("failure_threshold", "success_threshold"):
        if key in table:
            values[key] = _number(table[key], f"{where}{key}", int, 1)
    for key in ("window", "reset_timeout"):
        if key in table:
            values[key] = _number(table[key], f"{where}{key}", float, 0.001)
    if "on_redis_error" in table:
        choice = table["on_redis_error"]
        if choice not in ON_REDIS_ERROR:
            raise ConfigError(
                f"{where}on_redis_error", f"{choice!r} is not one of {ON_REDIS_ERROR}"
            )
        values["on_redis_error"] = choice
    return BreakerConfig(**values)


def _provider(name: str, table: Mapping[str, Any], timeouts: Timeouts) -> ProviderConfig:
    from delivery.providers import adapter_for  # the registry imports this module

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
        raise ConfigError(f"channels.{name}", f"unknown channel (expected one of {CHANNELS})")
    _only(table, {"provider", "on_unknown", "max_attempts"}, where)
    if "provider" not in table:
        raise ConfigError(f"{where}provider", "is required")
    provider = _string(table["provider"], f"{where}provider")
    if provider not in providers:
        raise ConfigError(f"{where}provider", f"{provider!r} is not a configured provider")
    from delivery.providers import adapter_for  # the registry imports this module

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
        raise ConfigError(f"{where}priority", f"{priority!r} is not one of {PRIORITIES}")
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
    database_url = env.get("DELIVERY_DATABASE_URL") or f"sqlite:///{home}/outbox.sqlite3"
    broker_url = env.get("DELIVERY_BROKER_URL") or "filesystem://"
    return settings_from_mapping(
        data,
        database_url=database_url,
        broker_url=broker_url,
        redis_url=env.get("DELIVERY_REDIS_URL") or None,
        home=home,
    )
