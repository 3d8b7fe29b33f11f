"""``delivery console``: serve the ops console (``delivery.console``) on the configured outbox;
without operators or without Flask it refuses to start (exit 2, naming what is missing)."""

from __future__ import annotations

import os

import click

from delivery.cli.common import binding, host_port_options, require_extra
from delivery.config.loading import load_settings
from delivery.runtime.hooks import use_outcome_hooks

__all__ = ["console_command"]


@click.command("console")
@host_port_options(8025)
def console_command(host: str, port: int) -> None:
    """Serve the ops console: search, timelines, redrive / resolve / cancel, audit.

    Operators come from DELIVERY_CONSOLE_AUTH=user:password[,user:password] (passwords of
    12+ characters), read-only viewers from DELIVERY_CONSOLE_VIEWERS; the outbox from the
    same DELIVERY_* settings as every command.
    """
    require_extra("console")
    from delivery.console import parse_users
    from delivery.console.app import create_app
    from delivery.console.server import make_console_server, serve

    users = parse_users(os.environ)
    settings = load_settings()
    use_outcome_hooks(settings)  # a resolve to dead is told to the app's outcome hooks
    app = create_app(settings=settings, users=users)
    with binding(host, port):
        server = make_console_server(app, host, port)
    serve(
        server,
        ready=lambda url: click.echo(
            f"delivery console on {url} ({len(users.operators)} operators, "
            f"{len(users.viewers)} viewers); Ctrl-C stops it",
            err=True,
        ),
    )
