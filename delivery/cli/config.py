"""``delivery config check|schema|example``: the settings file, checked, described, started.

``check`` loads the settings as every process does at start-up; it does not connect to the
database or the broker."""

from __future__ import annotations

import json
import os
from importlib.resources import files

import click

from delivery.config.loading import load_settings
from delivery.runtime.hooks import outcome_hooks

__all__ = ["config_group"]


@click.group("config")
def config_group() -> None:
    """The settings file (DELIVERY_CONFIG): check it, describe it, start one."""


@config_group.command("check")
@click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False))
def check_command(file: str | None) -> None:
    """Check FILE (or $DELIVERY_CONFIG) and the environment; print ok.

    Settings load as at every start-up, DELIVERY_* variables included, and the outcome hooks
    they name import; a wrong value prints one line naming its key and exits 2.
    """
    environ = dict(os.environ)
    if file is not None:
        environ["DELIVERY_CONFIG"] = file
    outcome_hooks(load_settings(environ))  # as each process imports them at its start
    click.echo("ok")


@config_group.command("schema")
def schema_command() -> None:
    """Print the JSON Schema of delivery.toml (for an editor)."""
    from delivery.config.schema import json_schema  # pydantic: only for the commands needing it

    click.echo(json.dumps(json_schema(), indent=2))


@config_group.command("example")
def example_command() -> None:
    """Print a commented delivery.toml to start from."""
    click.echo(files("delivery.config").joinpath("example.toml").read_text(), nl=False)
