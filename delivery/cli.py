"""The ``delivery`` command: schema migrations, ops queries and repairs, and the stub provider.

Settings come from ``delivery.config.load_settings()`` (``DELIVERY_DATABASE_URL``,
``DELIVERY_CONFIG``, ...), read when a command runs, so ``--help`` always works. A bad setting
or a ``DeliveryError`` prints ``error: ...`` on stderr and exits 2, without a traceback.

To add a command, open the outbox with ``_session()`` (it never commits; the command does)::

    @main.command()
    def example() -> None:
        with _session() as session:
            ...
            session.commit()
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session

from delivery import ops
from delivery.config import Settings, load_settings
from delivery.db import current_revision, make_engine, make_sessionmaker, upgrade
from delivery.errors import DeliveryError, MessageNotFound
from delivery.models import Attempt, Message, utcnow

__all__ = ["main", "parse_since"]

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DURATION = re.compile(r"(\d+)\s*([smhdw])")


class _Group(click.Group):
    """A group that turns expected errors into ``error: ...`` and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DeliveryError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)
        except (OperationalError, ProgrammingError) as exc:
            click.echo(
                f"error: database: {exc.orig} (is it reachable, and migrated with "
                "`delivery db upgrade`?)",
                err=True,
            )
            ctx.exit(2)


def parse_since(value: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """``30m``, ``2h``, ``7d`` (also ``s``, ``w``) ago, or an ISO-8601 time (naive means UTC).

    Raises ``click.BadParameter`` naming ``--since`` on anything else.
    """
    text = value.strip()
    match = _DURATION.fullmatch(text)
    try:
        if match:
            amount = dt.timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
            return (now or utcnow()) - amount
        moment = dt.datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        pass
    else:
        return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    raise click.BadParameter(
        f"{value!r} is neither a duration (30m, 2h, 7d) nor an ISO-8601 time",
        param_hint="'--since'",
    )


def _since(_ctx: click.Context, _param: click.Parameter, value: str | None) -> dt.datetime | None:
    return None if value is None else parse_since(value)


def _settings() -> Settings:
    return load_settings()


@contextmanager
def _engine(settings: Settings | None = None) -> Iterator[Engine]:
    """An engine on the configured outbox, disposed on exit."""
    engine = make_engine((settings or _settings()).database_url)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def _session(settings: Settings | None = None) -> Iterator[Session]:
    """A session on the configured outbox. It never commits: the command does."""
    with _engine(settings) as engine, make_sessionmaker(engine)() as session:
        yield session


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _cell(value: object) -> Text:
    """Plain text for a table cell: never parsed as rich markup."""
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, dt.datetime):
        return Text(value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S"))
    return Text(str(value))


def _table(*headers: str) -> Table:
    """A table whose long values (keys, errors) fold onto more lines, never get cut."""
    table = Table()
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))


@click.group(cls=_Group)
@click.version_option(package_name="delivery")
def main() -> None:
    """Transactional outbox for SMS, email and webhooks: inspect and repair messages."""


@main.group()
def db() -> None:
    """Schema migrations of the outbox."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the outbox tables to the newest revision."""
    settings = _settings()
    with _engine(settings) as engine:
        upgrade(engine)
        revision = current_revision(engine)
    url = make_url(settings.database_url).render_as_string(hide_password=True)
    click.echo(f"{url} is at revision {revision}")


@db.command("current")
def db_current() -> None:
    """Print the outbox's schema revision (``none`` before ``db upgrade``)."""
    with _engine() as engine:
        revision = current_revision(engine)
    click.echo(revision or "none")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object: status -> count.")
def stats(as_json: bool) -> None:
    """Count messages in every status."""
    with _session() as session:
        counts = ops.stats(session)
    if as_json:
        _echo_json(counts)
        return
    table = Table("status", "messages", title="delivery outbox")
    for status, count in counts.items():
        table.add_row(_cell(status), _cell(count))
    table.add_section()
    table.add_row(Text("total", style="bold"), _cell(sum(counts.values())))
    _console().print(table)


def _messages_table(messages: Sequence[Message], title: str) -> Table:
    table = _table("id", "key", "channel", "recipient", "tries", "code", "updated (UTC)", "error")
    table.title = title
    for message in messages:
        fields = ops.message_dict(message)
        table.add_row(
            _cell(message.id),
            _cell(message.key),
            _cell(message.channel),
            _cell(fields["recipient"]),
            _cell(f"{message.attempts}/{message.max_attempts}"),
            _cell(message.last_error_code),
            _cell(message.updated_at),
            _cell(message.last_error),
        )
    return table


@main.command("dead")
@click.option(
    "--since", callback=_since, metavar="2h|30m|7d|ISO", help="Only messages that died since then."
)
@click.option("--code", help="Only messages whose last error code is CODE.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of messages.")
def dead_command(since: dt.datetime | None, code: str | None, limit: int, as_json: bool) -> None:
    """List dead messages, most recent first."""
    with _session() as session:
        messages = ops.dead(session, since=since, code=code, limit=limit)
    if as_json:
        _echo_json([ops.message_dict(message) for message in messages])
        return
    if not messages:
        click.echo("no dead messages")
        return
    _console().print(_messages_table(messages, f"{len(messages)} dead"))


def _attempts_table(attempts: Sequence[Attempt]) -> Table:
    table = _table("#", "kind", "started (UTC)", "outcome", "http", "code", "ms", "error")
    table.title = "attempts"
    for attempt in attempts:
        latency = None if attempt.latency_ms is None else f"{attempt.latency_ms:.0f}"
        table.add_row(
            _cell(attempt.number),
            _cell(attempt.kind),
            _cell(attempt.started_at),
            _cell(attempt.outcome),
            _cell(attempt.http_status),
            _cell(attempt.error_code),
            _cell(latency),
            _cell(attempt.error),
        )
    return table


@main.command()
@click.argument("ref", metavar="ID_OR_KEY")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the attempts.")
@click.option("--reveal", is_flag=True, help="Show the recipient and payload unmasked.")
def show(ref: str, as_json: bool, reveal: bool) -> None:
    """Show one message and its full attempt log."""
    with _session() as session:
        message, attempts = ops.show(session, ref)
    data = ops.message_dict(message, attempts, reveal=reveal)
    if as_json:
        _echo_json(data)
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for name, value in data.items():
        if name == "attempts":
            continue
        if name == "payload" and reveal:
            value = json.dumps(value, ensure_ascii=False)
        grid.add_row(Text(name), _cell(value))
    console = _console()
    console.print(grid)
    if attempts:
        console.print(_attempts_table(attempts))
    else:
        console.print("no attempts yet")


@main.command("redrive")
@click.argument("refs", nargs=-1, required=True, metavar="ID_OR_KEY...")
@click.option("--json", "as_json", is_flag=True, help="A JSON list with one result per ref.")
def redrive_command(refs: tuple[str, ...], as_json: bool) -> None:
    """Send dead or unknown messages again, with the same key.

    Exits 1 if any ref was not found or not redriven.
    """
    rows: list[dict[str, Any]] = []
    with _session() as session:
        for ref in refs:
            try:
                (result,) = ops.redrive(session, [ref])
            except MessageNotFound as exc:
                rows.append(
                    {
                        "ref": ref,
                        "id": None,
                        "key": None,
                        "from_status": None,
                        "redriven": False,
                        "reason": str(exc),
                    }
                )
            else:
                rows.append(
                    {
                        "ref": result.ref,
                        "id": result.id,
                        "key": result.key,
                        "from_status": result.from_status,
                        "redriven": result.redriven,
                        "reason": result.reason,
                    }
                )
        session.commit()
    if as_json:
        _echo_json(rows)
    else:
        for row in rows:
            if row["redriven"]:
                click.echo(
                    f"redriven {row['ref']}: message {row['id']} (key {row['key']!r}) "
                    f"{row['from_status']} -> pending"
                )
            elif row["id"] is None:
                click.echo(f"not found {row['ref']}: {row['reason']}", err=True)
            else:
                click.echo(
                    f"not redriven {row['ref']}: message {row['id']} "
                    f"(key {row['key']!r}): {row['reason']}",
                    err=True,
                )
    if not all(row["redriven"] for row in rows):
        raise SystemExit(1)


@main.command("stub-provider")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9090,
    show_default=True,
    help="Port to bind, 0 for any.",
)
def stub_provider_command(host: str, port: int) -> None:
    """Run the fault-injecting stub provider in the foreground."""
    from delivery import stub_provider

    stub_provider.main(["--host", host, "--port", str(port)])


@main.command()
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
def demo(count: int, timeout: float, as_json: bool) -> None:
    """Run the whole pipeline (stub provider, celery worker and beat) with injected faults.

    With nothing configured it uses the embedded default: a SQLite outbox and a file broker
    in ./.delivery. It prints the messages per final status and the effects per key.
    """
    from dataclasses import asdict

    from delivery.demo import run_demo

    report = run_demo(count, timeout, progress=lambda line: None if as_json else click.echo(line))
    if as_json:
        _echo_json(asdict(report))
    else:
        table = _table("status", "messages")
        for status, n in report.statuses.items():
            table.add_row(_cell(status), _cell(n))
        _console().print(table)
        click.echo(
            f"provider: {report.effects} effects for {report.keys} keys, "
            f"{report.duplicated_keys} keys with more than one effect; "
            f"{report.dropped_answers} answers dropped after accept, "
            f"{report.provider_errors} 503s; {report.seconds} s"
        )
    final = sum(n for s, n in report.statuses.items() if s in ("sent", "dead", "unknown"))
    if final != count or report.duplicated_keys:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
