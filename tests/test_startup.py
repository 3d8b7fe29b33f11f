"""Processes and commands refuse to start broken, in one line naming the setting.

Worker and beat are started for real (``celery -A delivery.worker worker|beat``) against a
database that does not exist, one that exists but was never migrated, and a broker on a closed
port; each must exit non-zero within 10 s with exactly one output line naming the variable.
Commands that need a pip extra are run in a subprocess where importing that extra fails; server
commands on a port another socket holds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from tests.conftest import PG_SERVER, PG_URL, RUN_DIR, SLOT, free_port

START_LIMIT = 10.0


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = START_LIMIT):  # type: ignore[no-untyped-def]
    """Run ``argv`` to its end (``TimeoutExpired`` fails the test past ``timeout``)."""
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def lines_naming(output: str, word: str) -> list[str]:
    return [line for line in output.splitlines() if word in line]


@contextmanager
def scratch_database() -> Iterator[str]:
    """A PostgreSQL database of one test alone (unique name), created empty and dropped."""
    name = f"delivery_startup{SLOT}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture
def scratch_db(pg_engine: Engine) -> Iterator[str]:
    with scratch_database() as url:
        yield url


def celery(process: str) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "delivery.worker", process, "--loglevel=INFO"]
    if process == "worker":
        argv += ["--pool=threads", "--concurrency=1", "--without-gossip", "--without-mingle"]
    else:
        argv += ["-s", str(RUN_DIR / f"startup-beat-{uuid.uuid4().hex[:6]}")]
    return argv


def refused(process: str, env: dict[str, str], variable: str, tmp_path: Path) -> str:
    """Start ``process`` with ``env``; assert it exits non-zero within 10 s with one line
    naming ``variable`` and no traceback; return that line."""
    started = time.monotonic()
    done = run(celery(process), {**os.environ, **env}, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-2000:]
    assert time.monotonic() - started < START_LIMIT
    named = lines_naming(output, variable)
    assert len(named) == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert f"delivery {process} not started" in named[0]
    return named[0]


@pytest.mark.integration
@pytest.mark.parametrize("process", ["worker", "beat"])
def test_a_missing_database_stops_worker_and_beat_in_one_line(
    process: str, pg_engine: Engine, tmp_path: Path
) -> None:
    """A database URL naming no database: exit non-zero in one line naming
    DELIVERY_DATABASE_URL and the migration command."""
    missing = f"{PG_SERVER}/delivery_startup_missing_{uuid.uuid4().hex[:8]}"
    line = refused(process, {"DELIVERY_DATABASE_URL": missing}, "DELIVERY_DATABASE_URL", tmp_path)
    assert "does not exist" in line and "delivery db upgrade" in line


@pytest.mark.integration
@pytest.mark.parametrize("process", ["worker", "beat"])
def test_an_unmigrated_database_stops_worker_and_beat_in_one_line(
    process: str, scratch_db: str, tmp_path: Path
) -> None:
    """A database that exists but holds no outbox tables: one line naming the variable, the
    revision it needs and ``delivery db upgrade``."""
    line = refused(
        process, {"DELIVERY_DATABASE_URL": scratch_db}, "DELIVERY_DATABASE_URL", tmp_path
    )
    assert "revision none" in line and "delivery db upgrade" in line


@pytest.mark.integration
@pytest.mark.parametrize("process", ["worker", "beat"])
def test_an_unreachable_broker_stops_worker_and_beat_in_one_line(
    process: str, pg_engine: Engine, tmp_path: Path
) -> None:
    """A broker URL on a closed port (the outbox itself fine): one line naming
    DELIVERY_BROKER_URL, within 10 s, instead of retrying the connection forever."""
    env = {
        "DELIVERY_DATABASE_URL": PG_URL,
        "DELIVERY_BROKER_URL": f"redis://127.0.0.1:{closed_port()}/0",
    }
    line = refused(process, env, "DELIVERY_BROKER_URL", tmp_path)
    assert "cannot connect" in line


# -- commands that need a pip extra -------------------------------------------------------------

#: Every command that needs an extra of pyproject.toml, with the module the extra installs.
NEEDS_EXTRA = [
    (["console"], "console", "flask"),
    (["demo", "--console", "--count", "2"], "console", "flask"),
    (["flower"], "flower", "flower"),
    (["receiver"], "receiver", "granian"),
]


def without(module: str, tmp_path: Path) -> dict[str, str]:
    """An environment where ``import module`` fails as it does when the package is not
    installed. A directory first on PYTHONPATH holds a package of that name whose import
    raises ``ModuleNotFoundError`` naming it, which is exactly what Python raises for a module
    it cannot find; sys.path puts PYTHONPATH before site-packages, so the installed package is
    never reached, by ``import flask`` or by ``from flask import ...`` anywhere."""
    fake = tmp_path / "without" / module
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n"
    )
    return {
        **os.environ,
        "PYTHONPATH": str(fake.parent),
        "DELIVERY_HOME": str(tmp_path / "home"),
        "DELIVERY_CONSOLE_AUTH": "ops:a-long-passphrase",
        "FLOWER_BASIC_AUTH": "ops:a-long-passphrase",
    }


@pytest.mark.parametrize(("args", "extra", "module"), NEEDS_EXTRA)
def test_a_command_without_its_extra_says_which_in_one_line(
    args: list[str], extra: str, module: str, tmp_path: Path
) -> None:
    """Without its extra a command exits 2 before doing anything, with one line naming the
    pip extra (``delivery demo --console`` no longer runs the demo first)."""
    done = run(
        [sys.executable, "-m", "delivery.cli", *args], without(module, tmp_path), tmp_path, 30
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"error: this command needs the {extra!r} extra ({module} is not installed): "
        f"pip install 'delivery-outbox[{extra}]'"
    ]
    assert not (tmp_path / "home").exists()  # nothing started, nothing written


def test_every_extra_with_a_command_is_checked() -> None:
    """The list above covers every extra of pyproject.toml that a command needs: the ones the
    CLI checks (``EXTRAS``); the others (flask, django, test, bench) are libraries."""
    from delivery.cli.common import EXTRAS

    assert {extra for _, extra, _ in NEEDS_EXTRA} == set(EXTRAS)


# -- server commands on a busy port --------------------------------------------------------------


@pytest.mark.parametrize("command", ["stub-provider", "console", "metrics"])
def test_a_server_command_on_a_busy_port_says_so_in_one_line(
    command: str, db_url: str, tmp_path: Path
) -> None:
    """Another socket listens on the port: exit 2 with one line naming the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {
            **os.environ,
            "DELIVERY_DATABASE_URL": db_url,
            "DELIVERY_BROKER_URL": "filesystem://",
            "DELIVERY_CONSOLE_AUTH": "ops:a-long-passphrase",
        }
        done = run(
            [sys.executable, "-m", "delivery.cli", command, f"--port={port}"], env, tmp_path, 30
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use "
        f"(does another process have port {port}? choose another with --port)"
    ]


# -- delivery flower ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("auth", "problem"),
    [
        ("", "is not set"),
        ("ops:tiny1", "entry 1: the password is shorter than 12 characters"),
        ("ops:a-long-passphrase,ops:change-me-please", "entry 2: the password is a placeholder"),
    ],
)
def test_delivery_flower_refuses_weak_or_missing_auth_in_one_line(
    auth: str, problem: str, tmp_path: Path
) -> None:
    """``delivery flower`` without FLOWER_BASIC_AUTH, or with a weak password: exit 2, one
    line naming the variable (never the password)."""
    env = {**os.environ, "FLOWER_BASIC_AUTH": auth}
    done = run([sys.executable, "-m", "delivery.cli", "flower"], env, tmp_path, 30)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: config FLOWER_BASIC_AUTH: ") and problem in line, line
    assert "tiny1" not in line and "change-me-please" not in line


@pytest.mark.integration
def test_delivery_flower_serves_with_auth_and_keeps_its_state(
    pg_engine: Engine, tmp_path: Path
) -> None:
    """What a wheel user runs: ``delivery flower`` serves Flower on the delivery queues, 401
    without the credentials of FLOWER_BASIC_AUTH and 200 with them, its history in FLOWER_DB."""
    from delivery.testing.processes import ServiceProcess

    port = free_port()
    state = tmp_path / "flower" / "flower.db"
    env = {**os.environ, "FLOWER_BASIC_AUTH": "ops:a-long-passphrase", "FLOWER_DB": str(state)}
    argv = [sys.executable, "-m", "delivery.cli", "flower", f"--port={port}"]
    proc = ServiceProcess(
        "flower", argv, log=tmp_path / "flower.log", ready="Visit me at", env=env, cwd=tmp_path
    ).start()
    try:
        url = f"http://127.0.0.1:{port}/"
        assert httpx.get(url, timeout=10).status_code == 401
        assert httpx.get(url, auth=("ops", "a-long-passphrase"), timeout=10).status_code == 200
        assert "a-long-passphrase" not in Path(f"/proc/{proc.pid}/cmdline").read_text()
    finally:
        proc.stop()
    assert list(state.parent.glob("flower.db*")), "Flower saved no state on shutdown"


# -- a stop that comes before the start ----------------------------------------------------------


def test_a_stub_whose_start_was_interrupted_stops_without_joining_an_unstarted_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C inside ``StubServer.start`` (``Thread.start`` interrupted): ``stop`` then neither
    joins the thread that never started (``RuntimeError: cannot join thread before it is
    started``) nor waits forever for a serve loop that never ran, and the port is released."""
    import threading

    from delivery.testing.stub_provider import StubServer

    def interrupted(self: threading.Thread) -> None:
        raise KeyboardInterrupt

    stub = StubServer()
    port = stub.port
    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", interrupted)
        with pytest.raises(KeyboardInterrupt):
            stub.start()
    stopper = threading.Thread(target=stub.stop, daemon=True)
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive(), "stop() hangs on a serve loop that never ran"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # released


# -- what the commands say ----------------------------------------------------------------------


@pytest.mark.parametrize("command", [["stats"], ["dead"], ["show", "k"], ["db", "current"]])
def test_a_command_on_an_unmigrated_outbox_names_the_variable_in_one_line(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command's database error names DELIVERY_DATABASE_URL (the variable the user
    set, not a field called "database") and the migration command, in one line, exit 2."""
    from click.testing import CliRunner

    from delivery.cli import main

    monkeypatch.setenv("DELIVERY_DATABASE_URL", f"sqlite:///{tmp_path}/empty.sqlite3")
    monkeypatch.setenv("DELIVERY_BROKER_URL", "filesystem://")
    result = CliRunner().invoke(main, command)
    if command == ["db", "current"]:  # reads the revision only: an empty database is "none"
        assert (result.exit_code, result.output) == (0, "none\n")
        return
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: config DELIVERY_DATABASE_URL: the outbox sqlite:///"), line
    assert "has no delivery tables" in line and line.endswith("run `delivery db upgrade`")


def test_a_command_on_a_missing_database_names_the_variable_in_one_line(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL URL naming no database: ``stats`` says so naming the variable."""
    from click.testing import CliRunner

    from delivery.cli import main

    monkeypatch.setenv("DELIVERY_DATABASE_URL", f"{PG_SERVER}/delivery_startup_missing_x")
    result = CliRunner().invoke(main, ["stats"])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: config DELIVERY_DATABASE_URL: cannot use the outbox ")
    assert "does not exist" in line and "delivery db upgrade" in line


def test_db_upgrade_prints_each_migrations_one_line_summary(tmp_path: Path) -> None:
    """``delivery db upgrade`` prints one clean sentence per migration (its docstring's first
    line: no backticks, none cut mid-sentence), and every migration has such a line."""
    from delivery.runtime.db import head_revision, revisions_between

    summaries = revisions_between(None, head_revision())
    assert summaries and all(s.endswith(".") and "`" not in s for _, s in summaries), summaries
    env = {
        **os.environ,
        "DELIVERY_DATABASE_URL": f"sqlite:///{tmp_path}/new.sqlite3",
        "DELIVERY_BROKER_URL": "filesystem://",
    }
    done = run([sys.executable, "-m", "delivery.cli", "db", "upgrade"], env, tmp_path, 60)
    assert done.returncode == 0, done.stderr
    applied = [line for line in done.stdout.splitlines() if line.startswith("applied ")]
    assert applied == [f"applied {rev}: {summary}" for rev, summary in summaries]


def test_stats_says_what_its_age_counts(db_url: str) -> None:
    """``stats`` names its age "oldest due message" and says scheduled ones do not count."""
    from click.testing import CliRunner

    from delivery.cli import main

    result = CliRunner().invoke(main, ["stats"])
    assert result.exit_code == 0, result.output
    assert (
        "oldest due message: none (pending or in flight, and due; messages scheduled for later "
        "do not count)" in result.output
    )


def test_show_says_what_round_and_try_count(session: Session) -> None:
    """``delivery show`` explains its timeline's round and try numbers under it."""
    from click.testing import CliRunner

    from delivery.cli import main
    from tests.factories import add, add_attempt

    message = add(session, "s-1", "dead", attempts=1)
    add_attempt(session, message.id, "permanent")
    result = CliRunner().invoke(main, ["show", "s-1"])
    assert result.exit_code == 0, result.output
    assert "try N: the message's attempt count at that call, across rounds" in " ".join(
        result.output.split()
    )


#: Runs the stub's foreground ``main`` with the interleaving Ctrl-C on run.sh produces: the
#: terminal's SIGINT and the script's SIGTERM arrive together, so the second handler runs
#: inside the first, while it builds its stop thread. Making the stop thread's constructor
#: raise the second signal and wait for it pins that interleaving down.
SECOND_SIGNAL_INSIDE_THE_FIRST = """
import os, signal, sys, threading, time
real_init = threading.Thread.__init__
sent = []
def init(self, *args, **kwargs):
    if kwargs.get("name") == "stub-provider-stop" and not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the SIGTERM handler runs here, inside the SIGINT one
    real_init(self, *args, **kwargs)
threading.Thread.__init__ = init
def press_ctrl_c():  # once main() has installed its handlers, however slow the start
    while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        time.sleep(0.01)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=press_ctrl_c, daemon=True).start()
from delivery.testing.stub_provider import main
main(["--port", "0"])
print("stopped cleanly")
"""


def test_the_stub_stops_cleanly_when_a_second_signal_lands_inside_the_first() -> None:
    """SIGTERM handled inside the SIGINT handler (Ctrl-C on run.sh): the stub exits 0 without
    ``RuntimeError: cannot join thread before it is started`` (before: the nested handler
    started its own stop thread, the outer one then started that thread again, and the
    thread it had built was joined without ever being started)."""
    done = subprocess.run(
        [sys.executable, "-c", SECOND_SIGNAL_INSIDE_THE_FIRST],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "RuntimeError" not in done.stderr, done.stderr
    assert done.returncode == 0 and "stopped cleanly" in done.stdout, done.stderr
