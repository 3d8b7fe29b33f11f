"""Where a message goes: its channel, provider, unknown-outcome policy and limits, resolved from
``enqueue``'s arguments and the settings (``InvalidMessage`` naming the field). A route depends
only on the settings and the five routing arguments, so it is kept per settings object for
each combination of plain (``str``, ``int``, ``None``) arguments: a campaign resolves its
route once, not once per message.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from delivery.config.settings import ChannelConfig, MessageType, ProviderConfig, Settings
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError, InvalidMessage
from delivery.providers.registry import adapter_for

__all__ = ["Route", "route"]

#: Routes kept per settings object (distinct argument combinations; more are not kept).
_MAX_ROUTES = 256


@dataclass(frozen=True, slots=True)
class Route:
    """A message's resolved routing: the columns it fixes and the provider's recipient check."""

    channel: str
    provider: str
    on_unknown: str
    max_attempts: int
    message_type: str | None
    priority: str
    ttl: dt.timedelta | None
    #: The provider adapter's own ``check_recipient`` (``InvalidMessage``), if it has one.
    check_recipient: Callable[[str], None] | None


_cache: tuple[Settings | None, dict[tuple[Any, ...], Route]] = (None, {})


def route(settings: Settings, spec: Mapping[str, Any]) -> Route:
    """The route of a message given as ``enqueue``'s keyword arguments; ``InvalidMessage``
    naming the first bad one, checked in this order: type, channel, provider, on_unknown,
    max_attempts."""
    global _cache
    get = spec.get
    args = (get("type"), get("channel"), get("provider"), get("on_unknown"), get("max_attempts"))
    cacheable = all(a is None or a.__class__ is str for a in args[:4]) and (
        args[4] is None or args[4].__class__ is int
    )
    if not cacheable:
        return _resolve(settings, args)
    owner, routes = _cache
    if owner is not settings:
        routes = {}
        _cache = (settings, routes)
    found = routes.get(args)
    if found is None:
        found = _resolve(settings, args)
        if len(routes) < _MAX_ROUTES:
            routes[args] = found
    return found


def _resolve(settings: Settings, args: tuple[Any, ...]) -> Route:
    type, channel, provider, on_unknown, max_attempts = args
    kind = None
    if type is not None:
        kind = settings.types.get(type) if isinstance(type, str) else None
        if kind is None:
            known = ", ".join(sorted(settings.types)) or "none configured"
            raise InvalidMessage("type", f"{type!r} is not a configured message type ({known})")
        channel = kind.channel if channel is None else channel
    channel_config = settings.channel(channel) if isinstance(channel, str) else None
    if channel_config is None:
        raise InvalidMessage(
            "channel",
            f"{channel!r} is not a configured channel ({', '.join(sorted(settings.channels))})",
        )
    provider = provider or (kind and kind.provider) or channel_config.provider
    if provider not in settings.providers:
        raise InvalidMessage("provider", f"{provider!r} is not a configured provider")
    provider_config = settings.providers[provider]
    policy = _policy(on_unknown, kind, channel_config, provider_config)
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
    ):
        raise InvalidMessage("max_attempts", f"must be an integer >= 1, not {max_attempts!r}")
    return Route(
        channel=channel,
        provider=provider,
        on_unknown=policy.value,
        max_attempts=(
            max_attempts
            or (kind and kind.max_attempts)
            or channel_config.max_attempts
            or settings.max_attempts
        ),
        message_type=kind.name if kind else None,
        priority=kind.priority if kind else "normal",
        ttl=dt.timedelta(seconds=kind.ttl) if kind and kind.ttl else None,
        check_recipient=_recipient_check(provider_config),
    )


def _policy(
    on_unknown: str | None,
    kind: MessageType | None,
    channel: ChannelConfig,
    provider: ProviderConfig,
) -> UnknownPolicy:
    """Explicit argument, else the type's, else the channel's (or, for a provider other than
    the channel's, that provider kind's own default: Twilio has no keys, so ``lookup``)."""
    if on_unknown is None:
        if kind is not None and kind.on_unknown is not None:
            return kind.on_unknown
        if provider.name == channel.provider:
            return channel.on_unknown
        return adapter_for(provider.kind).default_on_unknown
    try:
        policy = UnknownPolicy(on_unknown)
    except ValueError:
        choices = ", ".join(p.value for p in UnknownPolicy)
        raise InvalidMessage("on_unknown", f"{on_unknown!r} is not one of {choices}") from None
    if policy is UnknownPolicy.LOOKUP and not adapter_for(provider.kind).supports_lookup:
        raise InvalidMessage(
            "on_unknown", f"provider {provider.name!r} ({provider.kind}) cannot look messages up"
        )
    return policy


def _recipient_check(config: ProviderConfig) -> Callable[[str], None] | None:
    """The adapter's ``check_recipient(config, to)`` bound to ``config``, or None."""
    try:
        adapter = adapter_for(config.kind)
    except ConfigError:  # raised where it was before: after the recipient's own check
        return lambda to: adapter_for(config.kind).check_recipient(config, to)
    if getattr(adapter.factory, "check_recipient", None) is None:
        return None
    return functools.partial(adapter.check_recipient, config)
