"""The shape of ``delivery.toml``: pydantic models that check every value of the file.

Tables refuse unknown keys, numbers are finite and in range, choices are enums, and checks
across keys (leases, references between tables) are model validators that name the key the
file sets, never a default it did not write. ``parse`` turns the first error into one
``ConfigError`` naming the dotted key (``delivery.config.problems``). A ``[providers.NAME]``
table also takes its adapter's ``config_keys`` (``delivery.providers.registry``); the JSON
Schema (``delivery config schema``) lists the built-in adapters' keys. Defaults are those of
``delivery.config.settings``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from delivery.config.problems import Invalid, config_error
from delivery.config.routes import FailoverAfter, ordered
from delivery.config.settings import (
    CHANNELS,
    DEFAULT_STUB_URL,
    Backoff,
    BreakerConfig,
    Channel,
    OnRedisError,
    Priority,
    Settings,
    Timeouts,
)
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError
from delivery.providers.registry import REGISTRY, Adapter, adapter_for

__all__ = ["LEASE_PER_RELAY", "ConfigFile", "json_schema", "parse"]

#: ``dispatch_lease`` spans at least this many relay passes, each of which renews the leases of
#: tasks still queued: a pass may run late under load without a queued task being taken for lost.
LEASE_PER_RELAY = 3.0
_SETTINGS, _TIMEOUTS = Settings(database_url="", broker_url=""), Timeouts()
_BACKOFF, _BREAKER = Backoff(), BreakerConfig()


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.rstrip("/")


Count = Annotated[int, Field(ge=1)]
Tally = Annotated[int, Field(ge=0)]
Interval = Annotated[float, Field(ge=0.01)]  # the [delivery] durations, seconds
Seconds = Annotated[float, Field(ge=0.001)]
Name = Annotated[str, Field(min_length=1)]
Url = Annotated[str, AfterValidator(_http_url), Field(json_schema_extra={"pattern": "^https?://"})]
Policy = Annotated[UnknownPolicy, Field(strict=False)]  # TOML gives the value, not the member
#: ``package.module:function`` (the function may be an attribute path: ``module:Class.method``).
HOOK_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"
HookNames = Annotated[
    list[str],
    Field(strict=False, json_schema_extra={"items": {"type": "string", "pattern": HOOK_PATTERN}}),
]  # strict=False: a framework's DELIVERY_OPTIONS may give a tuple


class Table(BaseModel):
    """A TOML table: unknown keys, NaN and infinities are refused, types are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and cls.model_config.get("extra") == "forbid":
            _only(data, cls.model_fields)
        return data


def _only(data: Mapping[str, Any], allowed: Mapping[str, Any] | set[str]) -> None:
    for key in data:
        if key not in allowed:
            raise Invalid(key, f"unknown key (expected one of {', '.join(sorted(allowed))})")


class Tuning(Table):
    """``[delivery]``: attempts, sizes, the relay's and the sweeper's pace, and the leases."""

    max_attempts: Count = _SETTINGS.max_attempts
    max_payload_bytes: Count = _SETTINGS.max_payload_bytes
    relay_interval: Interval = _SETTINGS.relay_interval
    relay_batch: Count = _SETTINGS.relay_batch
    dispatch_lease: Interval = _SETTINGS.dispatch_lease
    send_lease: Interval = _SETTINGS.send_lease
    hold_lease: Interval = _SETTINGS.hold_lease
    sweep_interval: Interval = _SETTINGS.sweep_interval
    max_countdown: Interval = _SETTINGS.max_countdown
    batch_size: Count = _SETTINGS.batch_size
    send_concurrency: Count = _SETTINGS.send_concurrency
    suppression_secret_env: Name = _SETTINGS.suppression_secret_env
    outcome_hooks: HookNames = []

    @model_validator(mode="after")
    def _hook_names(self) -> Self:
        for name in self.outcome_hooks:
            if not re.fullmatch(HOOK_PATTERN, name):
                problem = f"{name!r} is not 'package.module:function'"
                raise Invalid("outcome_hooks", problem)
        return self

    @model_validator(mode="after")
    def _leases(self) -> Self:
        given, passes = self.model_fields_set, LEASE_PER_RELAY * self.relay_interval
        if "hold_lease" in given and self.hold_lease >= self.send_lease:
            raise Invalid("hold_lease", f"must be below send_lease ({self.send_lease:g} s)")
        if self.dispatch_lease < passes:
            raise Invalid(
                "dispatch_lease" if "dispatch_lease" in given else "relay_interval",
                f"dispatch_lease ({self.dispatch_lease:g} s) must span {LEASE_PER_RELAY:g} "
                f"relay passes ({passes:g} s): the relay renews queued tasks on each pass",
            )
        return self


class TimeoutsTable(Table):
    """Per-phase HTTP timeouts in seconds (httpx's connect / write / read / pool)."""

    connect: Seconds = _TIMEOUTS.connect
    write: Seconds = _TIMEOUTS.write
    read: Seconds = _TIMEOUTS.read
    pool: Seconds = _TIMEOUTS.pool


class BackoffTable(Table):
    """Full-jitter backoff: delay ~ U(0, min(cap, base * 2**attempt)), in seconds."""

    base: Annotated[float, Field(ge=0)] = _BACKOFF.base
    cap: Annotated[float, Field(ge=0)] = _BACKOFF.cap

    @model_validator(mode="after")
    def _cap_above_base(self) -> Self:
        if self.cap < self.base:
            if "cap" in self.model_fields_set:
                raise Invalid("cap", f"must be >= base ({self.base:g} s)")
            raise Invalid("base", f"must be <= cap ({self.cap:g} s)")
        return self


class BreakerTable(Table):
    """A provider's circuit breaker; ``delivery.config.settings.BreakerConfig`` says how."""

    failure_rate: Annotated[float, Field(ge=0.001, le=1)] = _BREAKER.failure_rate
    minimum_calls: Count = _BREAKER.minimum_calls
    consecutive_failures: Tally = _BREAKER.consecutive_failures
    failure_threshold: Tally = _BREAKER.failure_threshold
    window: Seconds = _BREAKER.window
    reset_timeout: Seconds = _BREAKER.reset_timeout
    half_open_probes: Count = _BREAKER.half_open_probes
    enabled: bool = _BREAKER.enabled
    on_redis_error: OnRedisError = "local"


def _builtin_keys(schema: dict[str, Any]) -> None:
    """Add the built-in adapters' own keys to a provider table's JSON Schema."""
    for kind in sorted(REGISTRY):
        model = _options_model(tuple(adapter_for(kind).config_keys.items()))
        keys = model.model_json_schema(schema_generator=_TomlSchema).get("properties", {})
        for key, value in keys.items():
            schema["properties"].setdefault(key, {**value, "description": f"kind {kind!r} only"})


class ProviderTable(Table):
    """``[providers.NAME]``: ``kind`` picks the adapter, whose own keys this table takes too."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_builtin_keys)

    kind: Name = Field(examples=sorted(REGISTRY))
    base_url: Url | None = None
    api_key_env: Name | None = None
    timeouts: TimeoutsTable = TimeoutsTable()
    breaker: BreakerTable = BreakerTable()
    rate_limit: Seconds | None = None  # messages per second, shared by every worker

    @property
    def adapter(self) -> Adapter:
        try:
            return adapter_for(self.kind)
        except ConfigError as exc:
            raise Invalid("kind", exc.problem) from None

    def options(self) -> dict[str, Any]:
        """The adapter's own keys of this table, checked against its ``config_keys``."""
        extra = self.model_extra or {}
        model = _options_model(tuple(self.adapter.config_keys.items()))
        _only(extra, set(type(self).model_fields) | set(model.model_fields))
        try:
            return model.model_validate(extra).model_dump(exclude_unset=True)
        except ValidationError as exc:
            error = config_error(exc)
            raise Invalid(error.key, error.problem) from None

    def timeouts_over(self, base: Timeouts) -> Timeouts:
        """``base``, then the adapter's ``default_timeouts``, then this table's own."""
        own = {key: getattr(self.timeouts, key) for key in self.timeouts.model_fields_set}
        return replace(base, **{**self.adapter.default_timeouts, **own})

    @model_validator(mode="after")
    def _adapter_keys(self) -> Self:
        self.options()  # checks kind and the adapter's own keys
        if self.base_url is None and self.adapter.default_base_url is None:
            raise Invalid("base_url", "is required")
        return self


_OPTION_TYPES: dict[Any, Any] = {None: Any, str: Name}


@functools.lru_cache(maxsize=64)
def _options_model(keys: tuple[tuple[str, type | None], ...]) -> type[Table]:
    fields: dict[str, Any] = {}
    for key, kind in keys:
        option: Any = _OPTION_TYPES.get(kind, kind)
        fields[key] = (option | None, None)
    return create_model("AdapterOptions", __base__=Table, **fields)


class _Routed(Table):
    """A table with a route: one ``provider``, or the ordered ``providers`` a message fails
    over between (the first where it starts), and ``failover_after``."""

    provider: Name | None = None
    providers: Annotated[list[Name], Field(min_length=1)] | None = None
    failover_after: FailoverAfter | None = None

    @model_validator(mode="after")
    def _one_route(self) -> Self:
        self.route  # noqa: B018  # checked: provider and providers agree
        return self

    @property
    def route(self) -> tuple[str, ...]:
        """Its ordered providers; () when it names none."""
        return ordered(self.provider, self.providers)


class ChannelTable(_Routed):
    """``[channels.NAME]``: the providers a channel sends through, and its defaults (a
    ``failover_after`` not set: ``DEFAULT_FAILOVER_AFTER``)."""

    on_unknown: Policy | None = None  # default: the provider kind's (twilio: lookup)
    max_attempts: Count | None = None

    @model_validator(mode="after")
    def _a_provider(self) -> Self:
        if not self.route:
            raise Invalid("provider", "set provider (one) or providers (an ordered list)")
        return self


class Channels(Table):
    """``[channels]``: one table per channel (none: each through the first provider)."""

    email: ChannelTable | None = None
    sms: ChannelTable | None = None
    webhook: ChannelTable | None = None


class TypeTable(_Routed):
    """``[types.NAME]``: defaults for one kind of message, chosen with ``enqueue(type=...)``
    (no ``provider`` nor ``failover_after``: its channel's)."""

    channel: Channel
    on_unknown: Policy | None = None
    max_attempts: Count | None = None
    backoff: BackoffTable | None = None
    priority: Priority = "normal"
    ttl: Seconds | None = None  # seconds from the due time; past it the message expires
    suppress: bool = True  # false: its messages go out to a suppressed recipient too


class ConfigFile(Table):
    """``delivery.toml`` (``DELIVERY_CONFIG``): every table is optional."""

    model_config = ConfigDict(title="delivery.toml")

    delivery: Tuning = Tuning()
    backoff: BackoffTable = BackoffTable()
    timeouts: TimeoutsTable = TimeoutsTable()
    providers: dict[str, ProviderTable] = {}
    channels: Channels = Field(default_factory=Channels)  # a schema default would hold nulls
    types: dict[str, TypeTable] = {}

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """No provider: the stub on port 9090; no channel: each through the first provider."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        if not data.get("providers"):
            data["providers"] = {"stub": {"kind": "http", "base_url": DEFAULT_STUB_URL}}
        if not data.get("channels") and isinstance(data["providers"], Mapping):
            first = next(iter(data["providers"]))
            data["channels"] = {name: {"provider": first} for name in CHANNELS}
        return data

    def channel_tables(self) -> dict[str, ChannelTable]:
        return {n: t for n in CHANNELS if (t := getattr(self.channels, n)) is not None}

    @model_validator(mode="after")
    def _references(self) -> Self:
        channels = self.channel_tables()
        for name, channel in channels.items():
            self._lookup_check(f"channels.{name}", channel.route, channel.on_unknown)
        for name, kind in self.types.items():
            if kind.channel not in channels:
                problem = f"{kind.channel!r} is not a configured channel"
                raise Invalid(f"types.{name}.channel", problem)
            route = kind.route or channels[kind.channel].route
            self._lookup_check(f"types.{name}", route, kind.on_unknown)
        self._send_lease_check()
        return self

    def _lookup_check(self, where: str, route: tuple[str, ...], policy: Policy | None) -> None:
        """Each provider of ``route`` is configured; a ``lookup`` policy needs a lookup at the
        first (the others are asked if they can be, else sent again with the same key)."""
        for provider in route:
            if provider not in self.providers:
                key = "provider" if len(route) == 1 else "providers"
                raise Invalid(f"{where}.{key}", f"{provider!r} is not a configured provider")
        adapter = self.providers[route[0]].adapter
        if policy is UnknownPolicy.LOOKUP and not adapter.supports_lookup:
            problem = f"provider {route[0]!r} ({adapter.kind}) has no lookup"
            raise Invalid(f"{where}.on_unknown", problem)

    def _send_lease_check(self) -> None:
        """Each provider's total timeout stays below ``send_lease``. The key named is one the
        file sets: the lease, else the largest timeout the file gives that provider."""
        lease = self.delivery.send_lease
        for name, provider in self.providers.items():
            timeouts = provider.timeouts_over(Timeouts(**self.timeouts.model_dump()))
            if timeouts.total < lease:
                continue
            own, shared = provider.timeouts.model_fields_set, self.timeouts.model_fields_set
            given = {k: f"providers.{name}.timeouts.{k}" for k in own}
            for k in shared - own - set(provider.adapter.default_timeouts):
                given[k] = f"timeouts.{k}"
            key = "delivery.send_lease"
            if given and "send_lease" not in self.delivery.model_fields_set:
                key = given[max(given, key=lambda k: getattr(timeouts, k))]
            raise Invalid(
                key,
                f"provider {name!r}'s total timeout ({timeouts.total:g} s) must stay below "
                f"delivery.send_lease ({lease:g} s), or live sends would be taken for dead",
            )


def parse(data: Mapping[str, Any]) -> ConfigFile:
    """``data`` (a parsed TOML document) checked, or a ``ConfigError`` naming the key."""
    try:
        return ConfigFile.model_validate(_plain(data))
    except ValidationError as exc:
        raise config_error(exc) from None


def _plain(value: Any) -> Any:
    """Any mapping (e.g. a framework's ``DELIVERY_OPTIONS``) as the dicts a TOML file gives."""
    return {k: _plain(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def json_schema() -> dict[str, Any]:
    """A JSON Schema of ``delivery.toml`` for editors (``delivery config schema``)."""
    schema = ConfigFile.model_json_schema(schema_generator=_TomlSchema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


class _TomlSchema(GenerateJsonSchema):
    """TOML has no null: an optional key is absent, so its schema is the value's alone."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if "default" in schema and schema["default"] is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)
