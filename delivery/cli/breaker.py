"""``delivery breaker status|reset``: the circuit breakers shared through Redis."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
import redis

from delivery.cli.common import (
    cell,
    current_settings,
    echo_json,
    new_console,
    new_table,
)
from delivery.errors import ConfigError
from delivery.guards.breaker import Breakers

__all__ = ["breaker_group"]


@click.group("breaker")
def breaker_group() -> None:
    """Circuit breakers, one per provider, shared by the workers through Redis."""


@contextmanager
def _breakers() -> Iterator[Breakers]:
    """The configured providers' breakers on the shared Redis; exit 2 if there is none."""
    settings = current_settings()
    if settings.redis_url is None:
        raise ConfigError(
            "DELIVERY_REDIS_URL",
            "is not set: each worker process keeps its own breakers; nothing is shared",
        )
    breakers = Breakers(settings)
    try:
        assert breakers.client is not None
        breakers.client.ping()
    except redis.RedisError as exc:
        breakers.close()
        click.echo(f"error: Redis (DELIVERY_REDIS_URL) is unreachable: {exc}", err=True)
        raise SystemExit(2) from None
    try:
        yield breakers
    finally:
        breakers.close()


def _when(epoch: float | None) -> str | None:
    return None if epoch is None else dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat()


@breaker_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="A JSON list, one object per provider.")
def breaker_status(as_json: bool) -> None:
    """Show each provider's breaker: state, failures and calls in the window, next probe."""
    with _breakers() as breakers:
        rows: list[dict[str, Any]] = []
        for name in breakers.settings.providers:
            status = breakers.get(name).status()
            config = breakers.settings.providers[name].breaker
            rows.append(
                {
                    "provider": name,
                    "state": status.state,
                    "failures": status.failures,
                    "calls": status.calls,
                    "failure_rate": config.failure_rate,
                    "minimum_calls": config.minimum_calls,
                    "window": config.window,
                    "next_probe_at": _when(status.next_probe_at),
                    "probe_in_flight": status.probe_in_flight,
                }
            )
    if as_json:
        echo_json(rows)
        return
    table = new_table(
        "provider", "state", "failures / calls in window", "next probe (UTC)", "probe"
    )
    for row in rows:
        table.add_row(
            cell(row["provider"]),
            cell(row["state"]),
            cell(
                f"{row['failures']}/{row['calls']} in {row['window']:g} s "
                f"(opens at {row['failure_rate']:.0%} of >= {row['minimum_calls']})"
            ),
            cell(row["next_probe_at"] and row["next_probe_at"][:19].replace("T", " ")),
            cell("in flight" if row["probe_in_flight"] else None),
        )
    new_console().print(table)


@breaker_group.command("reset")
@click.argument("provider")
def breaker_reset(provider: str) -> None:
    """Close PROVIDER's breaker by hand and forget its failures."""
    with _breakers() as breakers:
        if provider not in breakers.settings.providers:
            known = ", ".join(breakers.settings.providers)
            raise click.BadParameter(
                f"{provider!r} is not a configured provider ({known})", param_hint="PROVIDER"
            )
        before = breakers.get(provider).reset()
    click.echo(f"breaker {provider}: {before} -> closed")
