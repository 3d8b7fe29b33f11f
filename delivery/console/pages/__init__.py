"""The console's pages, one module each, registered on the app by ``register``: ``overview``
(counts, charts), ``messages`` (search, a message's timeline and its repairs), ``bulk`` (bulk
repairs with a dry-run count), ``breakers`` (each provider's breaker, an audited reset),
``suppressions`` (the suppression list, an audited add and lift) and ``audit`` (every operator
action).

May import: ``delivery.console`` (app, charts, jobs), ``delivery.ops``, ``delivery.guards``,
``delivery.providers.registry`` and ``delivery.core`` (models, status).
"""

from __future__ import annotations

from flask import Flask

from delivery.console.pages import audit, breakers, bulk, messages, overview, suppressions

__all__ = ["register"]


def register(app: Flask) -> None:
    for module in (overview, messages, bulk, breakers, suppressions, audit):
        app.register_blueprint(module.blueprint)
