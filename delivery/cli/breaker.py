"""``delivery breaker status|reset``: the circuit breakers shared through Redis."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
import redis

from delivery.cli.common import cell, echo_json, new_console, new_table, open_session
from delivery.config.loading import load_settings
from delivery.errors import ConfigError, DeliveryError
from delivery.guards.breaker import Breakers
from delivery.ops.audit import cli_actor
from delivery.ops.breakers import breaker_rows, reset_breaker

__all__ = ["breaker_group"]


@click.group("breaker")
def breaker_group() -> None:
    """Circuit breakers, one per provider, shared by the workers through Redis."""


@contextmanager
def _breakers() -> Iterator[Breakers]:
    """The configured providers' breakers on the shared Redis; exit 2 if there is none."""
    settings = load_settings()
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
        raise DeliveryError(f"Redis (DELIVERY_REDIS_URL) is unreachable: {exc}") from None
    try:
        yield breakers
    finally:
        breakers.close()


@breaker_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="A JSON list, one object per provider.")
def breaker_status(as_json: bool) -> None:
    """Show each provider's breaker: state (closed, open, half-open), failures and calls in the
    window, next probe time."""
    with _breakers() as breakers:
        rows = breaker_rows(breakers)
    if as_json:
        echo_json([row.as_dict() for row in rows])
        return
    table = new_table(
        "provider", "state", "failures / calls in window", "next probe (UTC)", "probe"
    )
    for row in rows:
        table.add_row(
            cell(row.provider),
            cell(row.state),
            cell(
                f"{row.failures}/{row.calls} in {row.window:g} s "
                f"(opens at {row.failure_rate:.0%} of >= {row.minimum_calls})"
            ),
            cell(row.next_probe_at),
            cell("in flight" if row.probe_in_flight else None),
        )
    new_console().print(table)


@breaker_group.command("reset")
@click.argument("provider")
def breaker_reset(provider: str) -> None:
    """Close PROVIDER's breaker by hand and forget its failures (recorded in the audit)."""
    with _breakers() as breakers:
        if provider not in breakers.settings.providers:
            known = ", ".join(breakers.settings.providers)
            raise click.BadParameter(
                f"{provider!r} is not a configured provider ({known})", param_hint="PROVIDER"
            )
        with open_session(breakers.settings) as session:
            before = reset_breaker(session, breakers, provider, actor=cli_actor())
            session.commit()
    click.echo(f"breaker {provider}: {before} -> closed")
