"""``delivery receiver``: serve the receipt receiver (``delivery.receipts``) with waitress, a
production WSGI server; it refuses to start broken (exit 2, one line naming the setting)."""

from __future__ import annotations

import click

from delivery.cli.common import binding, host_port_options, require_extra
from delivery.config.loading import load_settings
from delivery.runtime.hooks import use_outcome_hooks

__all__ = ["receiver_command"]


@click.command("receiver")
@host_port_options(8026)
@click.option(
    "--threads", type=click.IntRange(1, 64), default=8, show_default=True, help="Worker threads."
)
def receiver_command(host: str, port: int, threads: int) -> None:
    """Receive providers' delivery receipts: POST /receipts/PROVIDER.

    Serves every provider whose [providers.NAME] sets receipt_secret_env (kind http) or
    status_callback_url (kind twilio), on the outbox of the same DELIVERY_* settings as every
    command. Each receipt is stored before it is answered.
    """
    require_extra("receiver")
    from waitress.server import create_server

    from delivery.receipts import make_receiver

    settings = load_settings()
    use_outcome_hooks(settings)  # delivered, undelivered: told to the app's outcome hooks
    app = make_receiver(settings)
    with binding(host, port):
        server = create_server(app, host=host, port=port, threads=threads, ident="delivery")
    # One address (--host names one): a TcpWSGIServer, bound to the port it reports.
    bound = getattr(server, "effective_port", port)
    names = ", ".join(sorted(app.checks))
    click.echo(
        f"delivery receiver on http://{host}:{bound}/receipts/ ({names}); Ctrl-C stops it",
        err=True,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
