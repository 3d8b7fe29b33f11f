"""Settings: one typed object built at start-up from the environment and a TOML file.

- ``settings``: the frozen classes (``Settings``, ``ProviderConfig``, ``ChannelConfig``,
  ``MessageType``, ``BreakerConfig``, ``Backoff``, ``Timeouts``).
- ``loading``: ``load_settings`` (environment and ``DELIVERY_CONFIG``) and
  ``settings_from_mapping``; a wrong value is a ``ConfigError`` naming its dotted key.

The process's current settings live in ``delivery.runtime.current``. ``settings`` may import
``delivery.pipeline.policies`` only; ``loading`` also ``delivery.errors`` and
``delivery.providers.registry`` (a provider's table is checked against its adapter).
"""
