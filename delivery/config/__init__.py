"""Settings: one typed object built at start-up from the environment and a TOML file.

- ``settings``: the frozen classes (``Settings``, ``ProviderConfig``, ``ChannelConfig``,
  ``MessageType``, ``BreakerConfig``, ``Backoff``, ``Timeouts``).
- ``schema``: the TOML file's pydantic models (``ConfigFile``), its checks and JSON Schema;
  ``problems`` turns their first error into a ``ConfigError`` naming the dotted key;
  ``routes``: a channel's or type's ``provider``/``providers`` and ``failover_after`` keys.
- ``loading``: ``load_settings`` (environment and ``DELIVERY_CONFIG``) and
  ``settings_from_mapping``, which build ``Settings`` from the checked file.
- ``urls``: database URLs as SQLAlchemy takes them. ``example.toml`` is the starting file
  ``delivery config example`` prints.

The process's current settings live in ``delivery.runtime.current``. ``settings`` may import
``delivery.core.policies`` only; the others also ``delivery.errors``, and ``schema`` also
``delivery.providers.registry`` (a provider's table is checked against its adapter).
"""
