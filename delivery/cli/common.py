"""What every command of the ``delivery`` CLI shares: settings, the outbox session, output.

Settings are read when a command runs (``load_settings()``), so ``--help`` always works.
Nothing a command prints can drive the terminal: ``cell``, ``echo`` and the error lines
replace control characters (escape sequences, bidi overrides, ...) with spaces, and
``echo_json`` writes them as JSON escapes (the same JSON value).
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session

from delivery.config.loading import load_settings
from delivery.config.settings import Settings
from delivery.core.bounds import printable
from delivery.core.models import utcnow
from delivery.errors import DeliveryError
from delivery.runtime.db import database_error, make_engine, make_sessionmaker

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "DeliveryGroup",
    "age",
    "binding",
    "cell",
    "echo",
    "echo_json",
    "host_port_options",
    "new_console",
    "new_table",
    "open_engine",
    "open_session",
    "parse_since",
    "progress_bar",
    "require_extra",
    "since_callback",
    "since_option",
]

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DURATION = re.compile(r"(\d+)\s*([smhdw])")


class DeliveryGroup(click.Group):
    """A group that turns expected errors into ``error: ...`` and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DeliveryError as exc:
            echo(f"error: {exc}", err=True)
            ctx.exit(2)
        except (OperationalError, ProgrammingError) as exc:
            try:
                url: str | None = load_settings().database_url  # read fine a moment ago
            except DeliveryError:
                url = None
            echo(f"error: {database_error(exc, url)}", err=True)
            ctx.exit(2)


#: Each pip extra a command needs -> the modules it installs that the command imports.
EXTRAS = {"console": ("flask",), "flower": ("flower",), "receiver": ("granian",)}


@contextmanager
def binding(host: str, port: int) -> Iterator[None]:
    """Around the one call that binds ``host:port``: its ``OSError`` (a port in use, an address
    this machine does not have) becomes a ``DeliveryError``, one line naming both."""
    try:
        yield
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else exc
        raise DeliveryError(
            f"cannot listen on {host}:{port}: {reason} "
            f"(does another process have port {port}? choose another with --port)"
        ) from None


def require_extra(extra: str) -> None:
    """Raise ``DeliveryError`` naming the pip extra ``extra`` unless every module of it imports
    (``error: ...``, exit 2). A command calls it first, before it starts or writes anything."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise DeliveryError(
                f"this command needs the {extra!r} extra ({module} is not installed): "
                f"pip install 'delivery-outbox[{extra}]'"
            ) from None


def parse_since(value: str, *, option: str = "--since") -> dt.datetime:
    """``30m``, ``2h``, ``7d`` (also ``s``, ``w``) ago, or an ISO-8601 time (naive means UTC).

    Raises ``click.BadParameter`` naming ``option`` on anything else.
    """
    text = value.strip()
    match = _DURATION.fullmatch(text)
    try:
        if match:
            amount = dt.timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
            return utcnow() - amount
        moment = dt.datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        pass
    else:
        return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    raise click.BadParameter(
        f"{value!r} is neither a duration (30m, 2h, 7d) nor an ISO-8601 time",
        param_hint=f"'{option}'",
    )


def since_option(help: str) -> Callable[[F], F]:
    """``--since 2h|30m|7d|ISO``, parsed into an aware datetime (``parse_since``)."""
    return click.option("--since", callback=since_callback, metavar="2h|30m|7d|ISO", help=help)


def since_callback(
    _ctx: click.Context, param: click.Parameter, value: str | None
) -> dt.datetime | None:
    """The callback of ``--since`` and ``--older-than``: ``parse_since`` naming the option."""
    return None if value is None else parse_since(value, option=param.opts[0])


@contextmanager
def open_engine(settings: Settings | None = None) -> Iterator[Engine]:
    """An engine on the configured outbox, disposed on exit."""
    engine = make_engine((settings or load_settings()).database_url)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def open_session(settings: Settings | None = None) -> Iterator[Session]:
    """A session on the configured outbox. It never commits: the command does."""
    with open_engine(settings) as engine, make_sessionmaker(engine)() as session:
        yield session


PIPE_WIDTH = 4096
"""The width of tables written to a pipe, a file or cron's mail: wide enough that a key (255
characters) or an error code is never split across lines."""


def new_console() -> Console:
    """A console for stdout. On a terminal, tables fit its width (long values fold); anywhere
    else (a pipe, a file, cron) nothing wraps, so ``grep KEY`` and ``cut`` see whole values."""
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


def cell(value: object) -> Text:
    """Plain text for a table cell: never parsed as rich markup."""
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, dt.datetime):
        return Text(value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S"))
    return Text(printable(str(value)))


def new_table(*headers: str) -> Table:
    """A table whose long values (keys, errors) fold onto more lines, never get cut."""
    table = Table()
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def echo(text: str, *, err: bool = False) -> None:
    """``click.echo`` of one line, control characters replaced by spaces."""
    click.echo(printable(text), err=err)


_UNSAFE_IN_JSON = re.compile(
    "[\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]"
)


def echo_json(value: Any) -> None:
    """One line of JSON; characters that could drive a terminal are written as escapes."""
    text = json.dumps(value, ensure_ascii=False)  # escapes C0 itself
    click.echo(_UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def age(seconds: float | None) -> str:
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


def progress_bar() -> Progress:
    """A progress bar on stderr, so that ``--json`` output on stdout stays clean."""
    return Progress(
        *Progress.get_default_columns(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def host_port_options(port: int) -> Callable[[F], F]:
    """``--host`` (default 127.0.0.1) and ``--port`` (default ``port``, 0 for any) of a server."""
    host = click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
    bind = click.option(
        "--port",
        type=click.IntRange(0, 65535),
        default=port,
        show_default=True,
        help="Port to bind, 0 for any.",
    )
    return lambda command: host(bind(command))
