"""The adapter registry: a provider's ``kind`` resolved to the class that speaks it.

A provider's ``kind`` (``[providers.NAME] kind = ...``) is resolved, first match wins, from:

1. ``REGISTRY``: the built-in kinds ``http`` (the reference protocol), ``twilio``, ``pigeon`` and
   ``webhook``; an app may add its own (``REGISTRY["acme"] = AcmeSms``) before settings load;
2. an entry point of that name in the group ``delivery.providers`` (in the app's
   ``pyproject.toml``: ``[project.entry-points."delivery.providers"] acme = "acme_sms:AcmeSms"``);
3. a dotted path, ``"package.module:Class"`` (or ``"package.module.Class"``).

An adapter is a class (any callable) taking its ``ProviderConfig`` and returning a ``Provider``
(``send``, ``lookup``, ``close``; see ``delivery.providers.base``). It may declare, as class
attributes (defaults in brackets):

- ``config_keys`` [none]: the extra keys its ``[providers.NAME]`` table accepts, a set of names
  or a mapping of name to ``str``, ``int``, ``float``, ``bool`` or ``list`` (checked by
  ``delivery.config.schema``); the values reach the adapter as ``config.options``. Any other
  key is still a ``ConfigError`` naming it.
- ``default_on_unknown`` [``retry``]: the unknown-outcome policy of a channel that sends
  through this provider and does not set ``on_unknown`` itself.
- ``supports_lookup`` [``True``]: ``False`` makes ``on_unknown = "lookup"`` on a channel of
  this provider a ``ConfigError``.
- ``default_base_url`` [``None``: ``base_url`` is required]; ``""`` when the adapter does not
  use one (webhooks go to each message's own URL).
- ``default_timeouts`` [none]: per-phase timeouts that win over ``[timeouts]``; the
  provider's own ``[providers.NAME.timeouts]`` wins over both.
- ``check_config(config)`` (a classmethod): raise ``ConfigError(key, problem)`` for a wrong
  setting; ``key`` is relative to the provider's table and gets prefixed with it.
- ``check_recipient(config, to)`` (a classmethod): raise ``InvalidMessage("to", problem)`` at
  ``enqueue`` for a recipient this provider can never send to (webhooks: a refused address).

Everything is checked when settings load, so that a wrong provider fails at start-up.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError
from delivery.providers.base import Provider
from delivery.providers.http import HttpProvider
from delivery.providers.pigeon import PigeonProvider
from delivery.providers.twilio import TwilioProvider
from delivery.providers.webhook import WebhookProvider

__all__ = [
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "Adapter",
    "AdapterFactory",
    "adapter_for",
    "build_provider",
]

ENTRY_POINT_GROUP = "delivery.providers"
AdapterFactory = Callable[[ProviderConfig], Provider]
REGISTRY: dict[str, AdapterFactory] = {
    "http": HttpProvider,
    "pigeon": PigeonProvider,
    "twilio": TwilioProvider,
    "webhook": WebhookProvider,
}
_OPTION_TYPES: tuple[type, ...] = (str, int, float, bool, list)
_found: dict[str, AdapterFactory] = {}  # entry points and dotted paths, imported once
_lock = threading.RLock()  # an adapter module may resolve kinds while it is imported


@dataclass(frozen=True, slots=True)
class Adapter:
    """A resolved ``kind``: the factory and what it declares (see the module docstring)."""

    kind: str
    factory: AdapterFactory
    config_keys: Mapping[str, type | None] = field(default_factory=dict)
    default_on_unknown: UnknownPolicy = UnknownPolicy.RETRY
    supports_lookup: bool = True
    default_base_url: str | None = None
    default_timeouts: Mapping[str, float] = field(default_factory=dict)

    def check(self, config: ProviderConfig, where: str) -> None:
        """Run the adapter's own ``check_config``; its error keys get the table's prefix."""
        check = getattr(self.factory, "check_config", None)
        if check is None:
            return
        try:
            check(config)
        except ConfigError as exc:
            raise ConfigError(f"{where}{exc.key}", exc.problem) from None

    def check_recipient(self, config: ProviderConfig, to: str) -> None:
        """Run the adapter's own ``check_recipient`` (``InvalidMessage`` naming ``to``)."""
        check = getattr(self.factory, "check_recipient", None)
        if check is not None:
            check(config, to)


def _declared(factory: AdapterFactory, kind: str, key: str) -> Adapter:
    """Read the optional class attributes of an adapter into an ``Adapter``."""
    raw_keys = getattr(factory, "config_keys", None) or {}
    keys: dict[str, type | None] = {}
    if isinstance(raw_keys, Mapping):
        for name, typ in raw_keys.items():
            if typ not in _OPTION_TYPES:
                raise ConfigError(
                    key,
                    f"{kind!r}: config_keys[{name!r}] must be one of str, int, float, bool, list",
                )
            keys[str(name)] = typ
    else:
        keys = {str(name): None for name in raw_keys}
    timeouts = dict(getattr(factory, "default_timeouts", None) or {})
    for name, seconds in timeouts.items():
        number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
        if name not in Timeouts.__dataclass_fields__ or not number:
            raise ConfigError(key, f"{kind!r}: default_timeouts[{name!r}] is not a timeout")
    try:
        policy = UnknownPolicy(getattr(factory, "default_on_unknown", UnknownPolicy.RETRY))
    except ValueError:
        raise ConfigError(key, f"{kind!r}: default_on_unknown is not a policy") from None
    return Adapter(
        kind=kind,
        factory=factory,
        config_keys=keys,
        default_on_unknown=policy,
        supports_lookup=bool(getattr(factory, "supports_lookup", True)),
        default_base_url=getattr(factory, "default_base_url", None),
        default_timeouts={k: float(v) for k, v in timeouts.items()},
    )


def _import(path: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError("expected 'package.module:Class'")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def _resolve(kind: str, key: str) -> AdapterFactory:
    factory = REGISTRY.get(kind)
    if factory is not None:
        return factory
    with _lock:
        factory = _found.get(kind)
        if factory is not None:
            return factory
        try:
            found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=kind)
            factory = next(iter(found)).load() if found else None
            if factory is None and ("." in kind or ":" in kind):
                factory = _import(kind)
        except Exception as exc:
            raise ConfigError(key, f"cannot load adapter {kind!r}: {exc!r}") from None
        if factory is None:
            known = ", ".join(sorted(REGISTRY))
            raise ConfigError(
                key,
                f"no adapter for kind {kind!r} (built in: {known}; or an entry point in group "
                f"{ENTRY_POINT_GROUP!r}, or a dotted path 'package.module:Class')",
            )
        if not callable(factory):
            raise ConfigError(key, f"{kind!r} is not a class or callable")
        _found[kind] = factory
        return _found[kind]


def adapter_for(kind: str, key: str = "kind") -> Adapter:
    """Resolve ``kind`` (registry, entry point, dotted path); ``ConfigError`` naming ``key``."""
    return _declared(_resolve(kind, key), kind, key)


def build_provider(config: ProviderConfig) -> Provider:
    """A live adapter for one configured provider."""
    return adapter_for(config.kind, f"providers.{config.name}.kind").factory(config)
