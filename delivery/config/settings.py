"""The settings object: frozen, typed parts, one ``Settings`` per process.

``delivery.config.loading`` builds it from the environment and an optional TOML file and
checks every value (a wrong one is a ``ConfigError`` naming its dotted key); these classes
only hold the result. Nothing here reads ``os.environ`` at import time: ``ProviderConfig``
reads its secret from the environment when an adapter asks for it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from delivery.core.policies import UnknownPolicy

__all__ = [
    "CHANNELS",
    "DEFAULT_FAILOVER_AFTER",
    "DEFAULT_HOME",
    "DEFAULT_STUB_URL",
    "PRIORITIES",
    "Backoff",
    "BreakerConfig",
    "Channel",
    "ChannelConfig",
    "MessageType",
    "OnRedisError",
    "Priority",
    "ProviderConfig",
    "Route",
    "Settings",
    "Timeouts",
]

Channel = Literal["email", "sms", "webhook"]
Priority = Literal["urgent", "normal", "bulk"]
OnRedisError = Literal["local", "allow"]
CHANNELS: tuple[str, ...] = get_args(Channel)
PRIORITIES: tuple[str, ...] = get_args(Priority)
DEFAULT_HOME = ".delivery"
DEFAULT_FAILOVER_AFTER = 60.0
"""Seconds from enqueue after which a message that cannot go out through its provider moves
to the next of its channel's ``providers`` (when it lists more than one)."""
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
    """A provider's circuit breaker, ``[providers.NAME.breaker]``: docs/configuration.md says
    what each key does, ``delivery.guards.breaker`` why these are the defaults."""

    failure_rate: float = 0.5
    minimum_calls: int = 40
    consecutive_failures: int = 10
    failure_threshold: int = 0
    window: float = 60.0
    reset_timeout: float = 30.0
    half_open_probes: int = 5
    enabled: bool = True
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
    #: False: its messages are sent to a recipient on the suppression list too (an OTP to a
    #: number that was unreachable for a while).
    suppress: bool = True
    #: Its own ordered providers (``provider`` is the first); None: its channel's.
    providers: tuple[str, ...] | None = None
    #: Seconds from enqueue before it fails over (``math.inf``: never); None: its channel's.
    failover_after: float | None = None


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    name: str
    provider: str
    on_unknown: UnknownPolicy = UnknownPolicy.RETRY
    max_attempts: int | None = None
    #: The ordered providers it fails over between (``provider`` first); () : ``provider`` alone.
    providers: tuple[str, ...] = ()
    #: Seconds from enqueue before a message fails over (``math.inf``: never).
    failover_after: float = DEFAULT_FAILOVER_AFTER


@dataclass(frozen=True, slots=True)
class Route:
    """The providers a message may be sent through, in order, and how long after its enqueue
    it may move to the next (``math.inf``: never): ``Settings.route``."""

    providers: tuple[str, ...]
    failover_after: float = math.inf


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
    dispatch_lease: float = 10.0  # covers a task between the relay's last look and its worker
    send_lease: float = 60.0
    hold_lease: float = 10.0  # a held message whose worker stopped renewing comes back then
    sweep_interval: float = 2.0
    max_countdown: float = 300.0
    #: Messages per ``delivery.deliver_batch`` task when the relay has a backlog (1: every
    #: message its own ``delivery.deliver`` task, the path before batches).
    batch_size: int = 50
    #: Sends in flight at once per worker process for a batch (its thread pool).
    send_concurrency: int = 8
    #: The environment variable holding the suppression list's secret (its recipients are
    #: kept as keyed hashes); unset, there is no suppression list.
    suppression_secret_env: str = "DELIVERY_SUPPRESSION_SECRET"
    #: The app's outcome hooks, ``"package.module:function"`` each, that the processes the app
    #: does not start itself (worker, beat, ``delivery receiver``, ...) import and register
    #: (``delivery.runtime.hooks``).
    outcome_hooks: tuple[str, ...] = ()
    home: str = DEFAULT_HOME

    def channel(self, name: str) -> ChannelConfig | None:
        return self.channels.get(name)

    def route(self, channel: str, message_type: str | None) -> Route:
        """The failover route of a message of ``channel`` and ``message_type``: its type's
        providers (or its one ``provider``), else its channel's; its type's
        ``failover_after``, else its channel's. A channel no longer configured: no route."""
        kind = self.types.get(message_type) if message_type else None
        config = self.channels.get(channel)
        providers: tuple[str, ...] = ()
        if kind is not None and kind.providers:
            providers = kind.providers
        elif kind is not None and kind.provider:
            providers = (kind.provider,)
        elif config is not None:
            providers = config.providers or (config.provider,)
        after = kind.failover_after if kind is not None else None
        if after is None:
            after = config.failover_after if config is not None else math.inf
        return Route(providers, after)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)
