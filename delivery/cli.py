"""The ``delivery`` command: migrations, ops queries and repairs, live view, metrics, stub.

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
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import click
import redis
from rich.console import Console, Group
from rich.live import Live
from rich.progress import MofNCompleteColumn, Progress
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session

from delivery import ops
from delivery.breaker import Breakers
from delivery.config import Settings, load_settings
from delivery.db import current_revision, make_engine, make_sessionmaker, upgrade
from delivery.errors import ConfigError, DeliveryError, MessageNotFound
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
@click.version_option(package_name="delivery-outbox")
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
@click.option(
    "--by-provider",
    is_flag=True,
    help="Also counts per provider and the oldest pending age (JSON: extra keys "
    "'by_provider' and 'oldest_pending_age_seconds' beside the status counts).",
)
def stats(as_json: bool, by_provider: bool) -> None:
    """Count messages in every status (and per provider, with --by-provider)."""
    with _session() as session:
        counts = ops.stats(session)
        providers = ops.stats_by_provider(session) if by_provider else {}
        oldest = ops.oldest_pending_age(session)
    if as_json:
        extra = {"by_provider": providers, "oldest_pending_age_seconds": oldest}
        _echo_json({**counts, **extra} if by_provider else counts)
        return
    table = Table("status", "messages", *providers, title="delivery outbox")
    for status, count in counts.items():
        table.add_row(_cell(status), _cell(count), *(_cell(c[status]) for c in providers.values()))
    table.add_section()
    totals = (_cell(sum(c.values())) for c in providers.values())
    table.add_row(Text("total", style="bold"), _cell(sum(counts.values())), *totals)
    console = _console()
    console.print(table)
    console.print(f"oldest pending: {_age(oldest)}")


def _age(seconds: float | None) -> str:
    """``none``, ``42 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if seconds is None:
        return "none"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


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


def _redrive_row(result: ops.RedriveResult) -> dict[str, Any]:
    return {
        "ref": result.ref,
        "id": result.id,
        "key": result.key,
        "from_status": result.from_status,
        "redriven": result.redriven,
        "reason": result.reason,
    }


def _progress() -> Progress:
    """A progress bar on stderr, so that ``--json`` output on stdout stays clean."""
    return Progress(
        *Progress.get_default_columns(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    )


_BULK = 500


@main.command("redrive")
@click.argument("refs", nargs=-1, metavar="ID_OR_KEY...")
@click.option("--all-dead", is_flag=True, help="Every dead message (filtered by --since, --code).")
@click.option(
    "--since", callback=_since, metavar="2h|30m|7d|ISO", help="With --all-dead: died since then."
)
@click.option("--code", help="With --all-dead: only those whose last error code is CODE.")
@click.option("--dry-run", is_flag=True, help="Say what would be redriven; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list with one result per message.")
def redrive_command(
    refs: tuple[str, ...],
    all_dead: bool,
    since: dt.datetime | None,
    code: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Send dead or unknown messages again, with the same key.

    Give ID_OR_KEY... or --all-dead. Exits 1 if any ref was not found or not redriven.
    """
    if bool(refs) == all_dead:
        raise click.UsageError("give either ID_OR_KEY... or --all-dead, not both or neither")
    if (since or code) and not all_dead:
        raise click.UsageError("--since and --code select dead messages: use them with --all-dead")
    if all_dead:
        _redrive_all_dead(since, code, dry_run, as_json)
        return
    rows: list[dict[str, Any]] = []
    with _session() as session:
        for ref in refs:
            try:
                if dry_run:
                    message = ops.find(session, ref)
                    ok = message.status in ops.REDRIVABLE
                    reason = None if ok else f"message is {message.status}"
                    result = ops.RedriveResult(
                        ref, message.id, message.key, message.status, ok, reason
                    )
                else:
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
                rows.append(_redrive_row(result))
        if not dry_run:
            session.commit()
    if as_json:
        _echo_json(rows)
    else:
        done = "would redrive" if dry_run else "redriven"
        for row in rows:
            if row["redriven"]:
                click.echo(
                    f"{done} {row['ref']}: message {row['id']} (key {row['key']!r}) "
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


def _redrive_all_dead(
    since: dt.datetime | None, code: str | None, dry_run: bool, as_json: bool
) -> None:
    """Redrive every matching dead message in batches of ``_BULK``, committing each."""
    rows: list[dict[str, Any]] = []
    with _session() as session:
        ids = ops.dead_ids(session, since=since, code=code)
        if dry_run:
            messages = ops.dead(session, since=since, code=code, limit=max(len(ids), 1))
            rows = [
                {
                    "ref": str(m.id),
                    "id": m.id,
                    "key": m.key,
                    "from_status": m.status,
                    "redriven": True,
                    "reason": None,
                }
                for m in messages
            ]
        else:
            with _progress() as progress:
                task = progress.add_task("redriving", total=len(ids))
                for start in range(0, len(ids), _BULK):
                    results = ops.redrive_ids(session, ids[start : start + _BULK])
                    session.commit()
                    rows.extend(_redrive_row(result) for result in results)
                    progress.advance(task, _BULK)
    if as_json:
        _echo_json(rows)
        return
    redriven = sum(1 for row in rows if row["redriven"])
    if dry_run:
        click.echo(f"would redrive {redriven} dead messages")
        table = _table("id", "key", "status")
        for row in rows[:50]:
            table.add_row(_cell(row["id"]), _cell(row["key"]), _cell(row["from_status"]))
        _console().print(table)
        if len(rows) > 50:
            click.echo(f"... and {len(rows) - 50} more")
        return
    click.echo(f"redriven {redriven} of {len(ids)} dead messages")
    for row in rows:
        if not row["redriven"]:
            click.echo(f"not redriven {row['ref']} (key {row['key']!r}): {row['reason']}", err=True)
    if redriven != len(ids):
        raise SystemExit(1)


@main.command("resolve")
@click.argument("ref", metavar="ID_OR_KEY")
@click.option(
    "--as",
    "to_status",
    type=click.Choice([status.value for status in ops.RESOLVABLE]),
    required=True,
    help="What the provider says happened: sent, or dead (never delivered).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the result.")
def resolve_command(ref: str, to_status: str, as_json: bool) -> None:
    """Settle an unknown message as sent or dead after checking with the provider.

    Exits 1 if the message is not unknown.
    """
    with _session() as session:
        result = ops.resolve(session, ref, to_status)
        session.commit()
    if as_json:
        _echo_json(asdict(result))
    elif result.resolved:
        click.echo(
            f"resolved {ref}: message {result.id} (key {result.key!r}) "
            f"{result.from_status} -> {result.to_status}"
        )
    else:
        click.echo(f"not resolved {ref}: {result.reason}", err=True)
    if not result.resolved:
        raise SystemExit(1)


@main.command("cancel")
@click.argument("refs", nargs=-1, required=True, metavar="ID_OR_KEY...")
@click.option("--json", "as_json", is_flag=True, help="A JSON list with one result per ref.")
def cancel_command(refs: tuple[str, ...], as_json: bool) -> None:
    """Cancel pending messages so they are never sent.

    A message already dispatched or sending is too late to cancel. Exits 1 if any ref was
    not cancelled.
    """
    results: list[ops.CancelResult] = []
    with _session() as session:
        for ref in refs:
            results.append(ops.cancel(session, ref))
        session.commit()
    if as_json:
        _echo_json([asdict(result) for result in results])
    else:
        for r in results:
            if r.cancelled:
                click.echo(
                    f"cancelled {r.ref}: message {r.id} (key {r.key!r}) pending -> cancelled"
                )
            else:
                click.echo(f"not cancelled {r.ref}: message {r.id}: {r.reason}", err=True)
    if not all(result.cancelled for result in results):
        raise SystemExit(1)


def _older_than(_ctx: click.Context, _param: click.Parameter, value: str) -> dt.datetime:
    try:
        return parse_since(value)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint="'--older-than'") from None


@main.command("prune")
@click.option(
    "--older-than",
    "cutoff",
    required=True,
    callback=_older_than,
    metavar="30d|12h|ISO",
    help="Delete final messages last changed before then.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Messages deleted per transaction.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the counts.")
def prune_command(cutoff: dt.datetime, batch: int, dry_run: bool, as_json: bool) -> None:
    """Delete final messages (sent, dead, unknown, cancelled) and their attempts.

    Works in batches, committing each; open messages are never deleted.
    """
    deleted, attempts = 0, 0
    with _session() as session:
        total = ops.prunable(session, cutoff)
        if not dry_run:
            with _progress() as progress:
                task = progress.add_task("pruning", total=total)
                while True:
                    done = ops.prune_batch(session, cutoff, limit=batch)
                    session.commit()
                    if not done.messages:
                        break
                    deleted, attempts = deleted + done.messages, attempts + done.attempts
                    progress.advance(task, done.messages)
    report = {
        "cutoff": cutoff.isoformat(),
        "dry_run": dry_run,
        "messages": total if dry_run else deleted,
        "attempts": attempts,
    }
    if as_json:
        _echo_json(report)
    elif dry_run:
        click.echo(
            f"would delete {total} final messages last changed before {cutoff:%Y-%m-%d %H:%M} UTC"
        )
    else:
        click.echo(
            f"deleted {deleted} final messages and {attempts} attempts "
            f"last changed before {cutoff:%Y-%m-%d %H:%M} UTC"
        )


def _breaker_states(settings: Settings, breakers: Breakers | None) -> dict[str, str]:
    """Each provider's breaker state from the shared Redis (``n/a`` without one)."""
    if breakers is None:
        return {name: "n/a (no DELIVERY_REDIS_URL)" for name in settings.providers}
    states: dict[str, str] = {}
    for name in settings.providers:
        status = breakers.get(name).status()
        states[name] = status.state if status.source == "redis" else "unreachable"
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
    statuses = _table("status", "messages", "change")
    statuses.title = f"delivery outbox at {snapshot['at'][11:19]} UTC"
    for status, count in snapshot["statuses"].items():
        delta = changed.get(status)
        statuses.add_row(
            _cell(status), _cell(count), _cell(None if delta is None else f"{delta:+d}")
        )
    rates = _table("per minute (last 60 s)", "")
    for name, value in snapshot["rates_per_minute"].items():
        rates.add_row(_cell(name), _cell(f"{value:g}"))
    rates.add_row(_cell("oldest pending"), _cell(_age(snapshot["oldest_pending_age_seconds"])))
    rates.add_row(_cell("relay lag"), _cell(_age(snapshot["relay_lag_seconds"])))
    breakers = _table("provider", "breaker")
    for provider, state in snapshot["breakers"].items():
        style = {"open": "bold red", "half_open": "yellow", "closed": "green"}.get(state, "dim")
        breakers.add_row(_cell(provider), Text(state, style=style))
    return Group(statuses, rates, breakers)


@main.command("watch")
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

    Refreshes every --interval seconds until Ctrl-C.
    """
    settings = _settings()
    breakers = None if settings.redis_url is None else Breakers(settings)
    console = _console()
    try:
        with _engine(settings) as engine:
            snapshot = _snapshot(engine, settings, breakers, None)
            if once:
                if as_json:
                    _echo_json(snapshot)
                else:
                    console.print(_watch_view(snapshot))
                return
            if as_json:
                while True:
                    _echo_json(snapshot)
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


@main.command("metrics")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9108,
    show_default=True,
    help="Port to bind, 0 for any.",
)
def metrics_command(host: str, port: int) -> None:
    """Serve Prometheus metrics read from the outbox (and the breakers) on every scrape.

    Messages by provider and status, dead-letter depth, oldest pending age, relay lag and
    breaker states. Attempt counters and send latency come from the workers
    (DELIVERY_METRICS_PORT, see tasks.metrics).
    """
    from prometheus_client import start_http_server

    from delivery.metrics import breaker_reader, exporter_registry

    settings = _settings()
    with _engine(settings) as engine:
        breakers = None if settings.redis_url is None else Breakers(settings)
        reader = None if breakers is None else breaker_reader(breakers)
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


@main.group("breaker")
def breaker_group() -> None:
    """Circuit breakers, one per provider, shared by the workers through Redis."""


@contextmanager
def _breakers() -> Iterator[Breakers]:
    """The configured providers' breakers on the shared Redis; exit 2 if there is none."""
    settings = _settings()
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
    """Show each provider's breaker: state, failures in the window, next probe time."""
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
                    "failure_threshold": config.failure_threshold,
                    "window": config.window,
                    "next_probe_at": _when(status.next_probe_at),
                    "probe_in_flight": status.probe_in_flight,
                }
            )
    if as_json:
        _echo_json(rows)
        return
    table = _table("provider", "state", "failures in window", "next probe (UTC)", "probe")
    for row in rows:
        table.add_row(
            _cell(row["provider"]),
            _cell(row["state"]),
            _cell(f"{row['failures']}/{row['failure_threshold']} in {row['window']:g} s"),
            _cell(row["next_probe_at"] and row["next_probe_at"][:19].replace("T", " ")),
            _cell("in flight" if row["probe_in_flight"] else None),
        )
    _console().print(table)


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


if __name__ == "__main__":
    main()
