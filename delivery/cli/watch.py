"""``delivery watch`` (a live view) and ``delivery metrics`` (a Prometheus exporter)."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.text import Text
from sqlalchemy import Engine

from delivery import ops
from delivery.cli.common import (
    age,
    binding,
    cell,
    echo_json,
    host_port_options,
    new_console,
    new_table,
    open_engine,
)
from delivery.config.loading import load_settings
from delivery.config.settings import Settings
from delivery.core.models import utcnow
from delivery.guards.breaker import Breakers
from delivery.ops.breakers import state_name
from delivery.runtime.db import make_sessionmaker

__all__ = ["metrics_command", "watch_command"]


def _breaker_states(settings: Settings, breakers: Breakers | None) -> dict[str, str]:
    """Each provider's breaker state from the shared Redis (``n/a`` without one)."""
    if breakers is None:
        return {name: "n/a (no DELIVERY_REDIS_URL)" for name in settings.providers}
    states: dict[str, str] = {}
    for name in settings.providers:
        status = breakers.get(name).status()
        shared = status.source == "redis" or status.state == "disabled"
        states[name] = state_name(status.state) if shared else "unreachable"
    return states


def _snapshot(
    engine: Engine, settings: Settings, breakers: Breakers | None, previous: dict[str, Any] | None
) -> dict[str, Any]:
    """One frame of ``watch``: counts (and their change), rates, ages, breakers."""
    with make_sessionmaker(engine)() as session:
        counts = ops.stats(session)
        snapshot: dict[str, Any] = {
            "at": utcnow().isoformat(),
            "statuses": counts,
            "rates_per_minute": ops.rates(session),
            "oldest_pending_age_seconds": ops.oldest_pending_age(session),
            "relay_lag_seconds": ops.relay_lag(session),
        }
    snapshot["breakers"] = _breaker_states(settings, breakers)
    if previous is not None:
        snapshot["changed"] = {
            status: count - previous["statuses"].get(status, 0) for status, count in counts.items()
        }
    return snapshot


def _watch_view(snapshot: dict[str, Any]) -> Group:
    changed = snapshot.get("changed", {})
    statuses = new_table("status", "messages", "change")
    statuses.title = f"delivery outbox at {snapshot['at'][11:19]} UTC"
    for status, count in snapshot["statuses"].items():
        delta = changed.get(status)
        statuses.add_row(cell(status), cell(count), cell(None if delta is None else f"{delta:+d}"))
    rates = new_table("per minute (last 60 s)", "")
    for name, value in snapshot["rates_per_minute"].items():
        rates.add_row(cell(name), cell(f"{value:g}"))
    rates.add_row(cell("oldest due message"), cell(age(snapshot["oldest_pending_age_seconds"])))
    rates.add_row(cell("relay lag"), cell(age(snapshot["relay_lag_seconds"])))
    breakers = new_table("provider", "breaker")
    for provider, state in snapshot["breakers"].items():
        style = {"open": "bold red", "half-open": "yellow", "closed": "green"}.get(state, "dim")
        breakers.add_row(cell(provider), Text(state, style=style))
    return Group(statuses, rates, breakers)


@click.command("watch")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines, one object per refresh.")
def watch_command(interval: float, once: bool, as_json: bool) -> None:
    """A live view: counts by status and their change, rates, oldest pending, breakers.

    Refreshes every --interval seconds until Ctrl-C. Without a terminal (a pipe, a log) it
    prints one frame per refresh; --json prints one JSON line per refresh.
    """
    settings = load_settings()
    breakers = None if settings.redis_url is None else Breakers(settings)
    console = new_console()
    try:
        with open_engine(settings) as engine:
            snapshot = _snapshot(engine, settings, breakers, None)
            if once or as_json or not console.is_terminal:
                # One frame, JSON lines, or no terminal to redraw in (a pipe, a service's log):
                # print each frame as it comes, so the output shows up now, not at Ctrl-C.
                while True:
                    if as_json:
                        echo_json(snapshot)
                    else:
                        console.print(_watch_view(snapshot))
                        console.file.flush()
                    if once:
                        return
                    time.sleep(interval)
                    snapshot = _snapshot(engine, settings, breakers, snapshot)
            with Live(_watch_view(snapshot), console=console, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    snapshot = _snapshot(engine, settings, breakers, snapshot)
                    live.update(_watch_view(snapshot), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        if breakers is not None:
            breakers.close()


@click.command("metrics")
@host_port_options(9108)
def metrics_command(host: str, port: int) -> None:
    """Serve Prometheus metrics read from the outbox (and the breakers) on every scrape.

    Messages by provider and status, dead-letter depth, oldest pending age, relay lag and
    breaker states. Attempt counters and send latency come from the workers
    (DELIVERY_METRICS_PORT, see delivery.worker.metrics).
    """
    from prometheus_client import start_http_server

    from delivery.observability.metrics import breaker_reader, exporter_registry

    settings = load_settings()
    with open_engine(settings) as engine:
        breakers = None if settings.redis_url is None else Breakers(settings)
        reader = None if breakers is None else breaker_reader(breakers)
        with binding(host, port):
            server, thread = start_http_server(
                port, addr=host, registry=exporter_registry(engine, reader)
            )
        click.echo(f"serving metrics on http://{host}:{server.server_port}/metrics", err=True)
        try:
            thread.join()
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            if breakers is not None:
                breakers.close()
