"""``delivery console``: serve the ops console (``delivery.console``) on the configured outbox.

It refuses to start without operators in ``DELIVERY_CONSOLE_AUTH`` (exit 2, naming the
variable) and without Flask (naming the pip extra).
"""

from __future__ import annotations

import os

import click

from delivery.cli.common import current_settings, host_port_options
from delivery.errors import ConfigError

__all__ = ["console_command"]


@click.command("console")
@host_port_options(8025)
def console_command(host: str, port: int) -> None:
    """Serve the ops console: search, timelines, redrive / resolve / cancel, audit.

    Operators come from DELIVERY_CONSOLE_AUTH=user:password[,user:password] (passwords of
    12+ characters), read-only viewers from DELIVERY_CONSOLE_VIEWERS; the outbox from the
    same DELIVERY_* settings as every command.
    """
    from delivery.console import INSTALL_HINT, parse_users

    users = parse_users(os.environ)
    try:
        from delivery.console.app import create_app
        from delivery.console.server import serve
    except ModuleNotFoundError as exc:
        raise ConfigError("console", f"needs Flask ({exc.name}): {INSTALL_HINT}") from None
    app = create_app(settings=current_settings(), users=users)
    serve(
        app,
        host,
        port,
        ready=lambda url: click.echo(
            f"delivery console on {url} ({len(users.operators)} operators, "
            f"{len(users.viewers)} viewers); Ctrl-C stops it",
            err=True,
        ),
    )
