"""``delivery stub-provider`` and ``delivery demo``: the tools of ``delivery.testing``."""

from __future__ import annotations

import click

from delivery.cli.common import (
    binding,
    cell,
    echo_json,
    host_port_options,
    new_console,
    new_table,
    require_extra,
)

__all__ = ["demo", "stub_provider_command"]


@click.command("stub-provider")
@host_port_options(9090)
def stub_provider_command(host: str, port: int) -> None:
    """Run the fault-injecting stub provider in the foreground."""
    from delivery.testing import stub_provider

    stub_provider.main(["--host", host, "--port", str(port)])


@click.command()
@click.option(
    "--count",
    type=click.IntRange(min=2),
    default=40,
    show_default=True,
    help="How many messages to push through.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Seconds to wait for every message to be final.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--console",
    "with_console",
    is_flag=True,
    help="Then leave the ops console running on the demo's outbox (until Ctrl-C).",
)
@click.option("--console-port", type=click.IntRange(0, 65535), default=8025, show_default=True)
def demo(count: int, timeout: float, as_json: bool, with_console: bool, console_port: int) -> None:
    """Run the whole pipeline (stub provider, celery worker and beat) with injected faults.

    With nothing configured it uses the embedded default: a SQLite outbox and a file broker
    in ./.delivery. It prints the messages per final status and the effects per key. With
    --console it then serves the ops console on that outbox (operators from
    DELIVERY_CONSOLE_AUTH, or a one-time user ``demo`` whose password it prints).
    """
    from dataclasses import asdict

    from delivery.testing.demo import run_demo

    if with_console:
        require_extra("console")  # before the demo runs, not after

    report = run_demo(count, timeout, progress=lambda line: None if as_json else click.echo(line))
    if as_json:
        echo_json(asdict(report))
    else:
        table = new_table("status", "messages")
        for status, n in report.statuses.items():
            table.add_row(cell(status), cell(n))
        new_console().print(table)
        click.echo(
            f"provider: {report.effects} effects for {report.keys} keys, "
            f"{report.duplicated_keys} keys with more than one effect; "
            f"{report.dropped_answers} answers dropped after accept, "
            f"{report.provider_errors} 503s; {report.seconds} s"
        )
    final = sum(n for s, n in report.statuses.items() if s in ("sent", "dead", "unknown"))
    if final != count or report.duplicated_keys:
        raise SystemExit(1)
    if with_console:
        _serve_demo_console(console_port)


def _serve_demo_console(port: int) -> None:
    """The console on the demo's outbox, with a one-time operator unless one is configured."""
    import os
    import secrets
    from pathlib import Path

    from delivery.config.loading import load_settings
    from delivery.console.app import create_app
    from delivery.console.server import make_console_server, serve

    home = Path(os.environ.get("DELIVERY_HOME", ".delivery")).resolve()
    env = {**os.environ, "DELIVERY_HOME": str(home), "DELIVERY_CONFIG": str(home / "demo.toml")}
    password = None
    if not env.get("DELIVERY_CONSOLE_AUTH"):
        password = secrets.token_urlsafe(12)
        env["DELIVERY_CONSOLE_AUTH"] = f"demo:{password}"
    app = create_app(settings=load_settings(env), environ=env)

    def ready(url: str) -> None:
        login = f"user demo, password {password}" if password else "DELIVERY_CONSOLE_AUTH"
        click.echo(f"ops console on {url} ({login}); Ctrl-C stops it", err=True)

    with binding("127.0.0.1", port):
        server = make_console_server(app, "127.0.0.1", port)
    serve(server, ready=ready)
