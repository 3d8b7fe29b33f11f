"""The app's outcome hooks in the processes it does not start itself.

An app registers its outcome hook in its own process (``delivery.add_outcome_hook``); a
message also ends in a Celery worker (``dead``, ``suppressed``), in beat's sweeper and in
``delivery receiver`` (``delivered``, ``undelivered``), or at an operator's ``delivery
resolve``. Those processes import and register the functions ``[delivery] outcome_hooks``
names (``"package.module:function"``) with ``use_outcome_hooks``, where they are built
(``Service.from_settings``, the worker's and beat's start-up checks, the receiver, console and
repair commands): a name that cannot be imported, or is not callable, is a ``ConfigError``
naming ``delivery.outcome_hooks``, and the process refuses to start.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from delivery.config.settings import Settings
from delivery.errors import ConfigError
from delivery.observability.events import Outcome, add_outcome_hook

__all__ = ["OUTCOME_HOOKS_KEY", "outcome_hooks", "use_outcome_hooks"]

OUTCOME_HOOKS_KEY = "delivery.outcome_hooks"


def outcome_hooks(settings: Settings) -> list[Callable[[Outcome], None]]:
    """The functions ``settings.outcome_hooks`` names, imported; ``ConfigError`` naming
    ``delivery.outcome_hooks`` for one that cannot be imported or is not callable."""
    return [_imported(name) for name in settings.outcome_hooks]


def use_outcome_hooks(settings: Settings) -> None:
    """Register this process's outcome hooks from ``settings`` (each once, however many times
    it is called: ``add_outcome_hook`` keeps a hook once)."""
    for hook in outcome_hooks(settings):
        add_outcome_hook(hook)


def _imported(name: str) -> Callable[[Outcome], None]:
    module_name, _, path = name.partition(":")
    try:
        found: object = importlib.import_module(module_name)
    except Exception as exc:  # an app module may fail in any way: name it, start nothing
        raise ConfigError(
            OUTCOME_HOOKS_KEY, f"{name!r}: cannot import {module_name!r}: {_why(exc)}"
        ) from None
    for attribute in path.split("."):
        try:
            found = getattr(found, attribute)
        except AttributeError:
            raise ConfigError(
                OUTCOME_HOOKS_KEY, f"{name!r}: {module_name!r} has no {path!r}"
            ) from None
    if not callable(found):
        raise ConfigError(OUTCOME_HOOKS_KEY, f"{name!r} is not callable")
    hook: Callable[[Outcome], None] = found
    return hook


def _why(exc: Exception) -> str:
    """``exc`` in one line: its type and the first line of its message."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
