"""The ops console: the outbox on a web page (``delivery console``).

Server-rendered pages over ``delivery.ops`` (every query and repair is the one the CLI runs),
on Flask, with no JavaScript at all: what each page shows, and why Flask, are in
[docs/operations.md](../../docs/operations.md#ops-console).

- ``app``: ``create_app`` (the WSGI app), its per-request session and error pages;
- ``auth``: operators and viewers from ``DELIVERY_CONSOLE_AUTH`` / ``DELIVERY_CONSOLE_VIEWERS``,
  HTTP Basic, and the CSRF token every POST carries;
- ``charts``: inline SVG line charts drawn on the server; ``context``: what a page reaches
  during a request (shared state, the request's session, the signed-in operator);
- ``jobs``: bulk repairs run in a thread, in batches, with progress;
- ``pages/``: one module per page (overview, messages, bulk, breakers, audit);
- ``server``: ``serve`` (what ``delivery console`` runs).

May import: ``delivery.ops``, ``delivery.config``, ``delivery.runtime``, ``delivery.guards``,
``delivery.errors``, ``delivery.core`` (models, status); never the CLI or Celery.
"""

from __future__ import annotations

from delivery.console.auth import Users, parse_users

__all__ = ["Users", "parse_users"]
