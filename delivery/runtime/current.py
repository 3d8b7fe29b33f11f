"""Process-wide settings, loaded from the environment on first use (or set explicitly, or
loaded on first use by a function of the caller's: ``configure_lazily``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from delivery.config.loading import load_settings
from delivery.config.settings import Settings

__all__ = ["configure", "configure_lazily", "get_settings"]

_lock = threading.Lock()
_settings: Settings | None = None
_loader: Callable[[], Settings] = load_settings


def configure(settings: Settings | None) -> None:
    """Use ``settings`` for this process (``None`` reloads from the environment next time)."""
    global _settings, _loader
    with _lock:
        _settings, _loader = settings, load_settings


def configure_lazily(loader: Callable[[], Settings]) -> None:
    """Build this process's settings with ``loader`` when they are first needed; its
    ``ConfigError`` is raised there, by ``get_settings``, until a call succeeds."""
    global _settings, _loader
    with _lock:
        _settings, _loader = None, loader


def get_settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = _loader()
        return _settings
