"""``delivery flower``: Flower on the delivery queues, with authentication and persistence
([docs/operations.md](../../docs/operations.md#flower); ``deploy/flowerconfig.py`` is the same
settings as a file). Checks done, it replaces itself with ``celery -A delivery.worker flower``,
which reads ``FLOWER_BASIC_AUTH`` from the environment: no password reaches the command line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from delivery.cli.common import host_port_options, require_extra
from delivery.console.auth import MIN_PASSWORD
from delivery.errors import ConfigError

__all__ = ["MIN_PASSWORD", "flower_command", "password_problem"]

PLACEHOLDERS = ("change-me", "changeme", "change_me", "password", "secret", "example", "admin")
#: Columns of the tasks page: the uuid is the message key, args are (message_id, key).
TASKS_COLUMNS = "name,uuid,state,args,retries,eta,exception,received,started,runtime,worker"


def password_problem(credential: str) -> str | None:
    """Why one ``user:password`` must not guard the dashboard, or None (names neither)."""
    user, sep, password = credential.partition(":")
    if not sep or not user or not password:
        return "is not user:password"
    if len(password) < MIN_PASSWORD:
        return f"the password is shorter than {MIN_PASSWORD} characters"
    lowered = password.lower()
    if lowered == user.lower() or any(word in lowered for word in PLACEHOLDERS):
        return "the password is a placeholder or the user name; choose a real one"
    return None


def check_basic_auth(value: str) -> None:
    """Raise ``ConfigError`` naming ``FLOWER_BASIC_AUTH`` (and the entry) unless it holds at
    least one ``user:password`` and every one is strong enough."""
    credentials = [c.strip() for c in value.split(",") if c.strip()]
    if not credentials:
        raise ConfigError(
            "FLOWER_BASIC_AUTH",
            "is not set: set it to user:password (several separated by commas); "
            "Flower does not run without authentication",
        )
    for n, credential in enumerate(credentials, start=1):
        problem = password_problem(credential)
        if problem is not None:
            raise ConfigError("FLOWER_BASIC_AUTH", f"entry {n}: {problem}")


@click.command("flower")
@host_port_options(5555)
@click.option(
    "--db",
    "state_file",
    envvar="FLOWER_DB",
    default="flower.db",
    show_default=True,
    help="File keeping Flower's task history across restarts (FLOWER_DB).",
)
def flower_command(host: str, port: int, state_file: str) -> None:
    """Serve Flower on the delivery queues: FLOWER_BASIC_AUTH=user:password required, the task
    history kept in FLOWER_DB; task ids are message keys, so its search finds a message by key.
    """
    require_extra("flower")
    check_basic_auth(os.environ.get("FLOWER_BASIC_AUTH", ""))
    argv = [
        sys.executable,
        *("-m", "celery", "-A", "delivery.worker", "flower"),
        f"--port={port}",
        f"--address={host}",
        "--persistent=True",
        f"--db={state_file}",
        "--state_save_interval=60000",
        "--max_tasks=100000",
        f"--tasks_columns={TASKS_COLUMNS}",
        "--natural_time=False",
    ]
    Path(state_file).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    os.execv(sys.executable, argv)
