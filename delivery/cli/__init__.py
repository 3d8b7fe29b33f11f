"""The ``delivery`` command: migrations, ops queries and repairs, live view, metrics, stub.

One module per command group; each parses its options, asks ``delivery.ops`` (or the breakers,
or the migrations) and renders the answer; none holds a query of its own:

- ``db``: ``db upgrade``, ``db current``;
- ``config``: ``config check``, ``config schema``, ``config example``;
- ``inspect``: ``stats``, ``dead``, ``show``;
- ``repair``: ``redrive``, ``resolve``, ``cancel``;
- ``prune``: ``prune``;
- ``watch``: ``watch``, ``metrics``;
- ``breaker``: ``breaker status``, ``breaker reset``;
- ``suppression``: ``suppression list``, ``suppression add``, ``suppression lift``;
- ``testing``: ``stub-provider``, ``demo``;
- ``console``: ``console`` (the web console, ``delivery.console``);
- ``receiver``: ``receiver`` (the receipt receiver, ``delivery.receipts``);
- ``flower``: ``flower`` (Flower with authentication and persistence);
- ``common``: what they share (settings, the outbox session, tables, JSON, ``--since``).

To add a command, write it in the module of its group, opening the outbox with
``open_session()`` (it never commits: the command does), and add it to ``main`` below.

May import anything of ``delivery`` but ``delivery.contrib``; never Celery.
"""

from __future__ import annotations

import click

from delivery.cli import (
    breaker,
    config,
    console,
    db,
    flower,
    inspect,
    prune,
    receiver,
    repair,
    suppression,
    testing,
    watch,
)
from delivery.cli.common import DeliveryGroup

__all__ = ["main"]


@click.group(cls=DeliveryGroup)
@click.version_option(package_name="delivery-outbox")
def main() -> None:
    """Transactional outbox for SMS, email and webhooks: inspect and repair messages."""


for _command in (
    db.db,
    config.config_group,
    inspect.stats,
    inspect.dead_command,
    inspect.show,
    repair.redrive_command,
    repair.resolve_command,
    repair.cancel_command,
    prune.prune_command,
    watch.watch_command,
    watch.metrics_command,
    testing.stub_provider_command,
    testing.demo,
    breaker.breaker_group,
    suppression.suppression_group,
    console.console_command,
    receiver.receiver_command,
    flower.flower_command,
):
    main.add_command(_command)
