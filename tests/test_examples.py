"""The docs' example sequences, run as written on a fresh copy of the repository.

For each example (sections "Flask" and "Django" of docs/integrations.md) the first ``sh`` block
is what a newcomer types in one terminal (a new virtualenv, ``pip install -e '.[EXTRA]'``, the
example's ``run.sh``) and the second what they type in another (a signup with curl, then
``delivery show``). The test copies the repository's files (what a clone has, nothing ignored
such as ``.venv``) into a temporary folder, runs the first block there with bash, in an
environment without this suite's ``DELIVERY_*`` variables or virtualenv, waits for the app,
runs the second block's commands and waits until ``delivery show`` reports the message
``sent``. Then it presses Ctrl-C (SIGINT to the block's process group, as a terminal does) and
checks that every process it started has ended.

Only three things differ from a person's terminal: ``PORT`` and ``STUB_PORT`` are free ports
(both blocks read them); in the Django blocks the placeholder in the
``export DELIVERY_DATABASE_URL=...`` lines is a fresh database of the suite's PostgreSQL; and
``PIP_COMPILE=0`` spares pip byte-compiling every installed module (about half of the install's
CPU time), a cache that changes nothing the example does: the modules it imports are compiled
when it first imports them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import PG_DB, PG_SERVER, RUN_DIR, free_port, need

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
INTEGRATIONS = ROOT / "docs" / "integrations.md"


def section_blocks(title: str) -> list[str]:
    """The ``sh`` blocks of one section of docs/integrations.md, as written."""
    text_ = INTEGRATIONS.read_text()
    section = text_.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def fresh_copy(dest: Path) -> Path:
    """What a clone of the repository holds: tracked and new files, nothing git ignores."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        source = ROOT / raw.decode()
        if source.is_file():
            target = dest / raw.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def newcomer_env(**extra: str) -> dict[str, str]:
    """A terminal's environment: none of this suite's settings, no virtualenv active; pip
    does not byte-compile what it installs (see the module docstring)."""
    venv_bin = str(Path(sys.executable).parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DELIVERY_", "DJANGO_", "PYTEST_", "VIRTUAL_ENV", "PYTHONPATH"))
    }
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    env["PIP_COMPILE"] = "0"  # pip install --no-compile
    env.update(extra)
    return env


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the first terminal ended ({proc.returncode}):\n{tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status < 500:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} did not answer within {timeout} s:\n{tail(log)}")


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else ""


def run_second_terminal(block: str, folder: Path, env: dict[str, str]) -> dict[str, str]:
    """Run the second block's commands in order, each after its ``.``/``export`` lines; the
    signup's JSON answer and ``delivery show``'s last output are returned."""
    lines = [line for line in block.splitlines() if line.strip()]
    setup = [line for line in lines if line.startswith((". ", "export "))]
    seen: dict[str, str] = {}
    for line in lines:
        if line in setup:
            continue
        script = "\n".join([*setup, line])
        attempts = 60 if line.startswith("delivery show") else 1
        for _ in range(attempts):
            done = subprocess.run(
                ["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True
            )
            seen[line.split()[0]] = done.stdout + done.stderr
            if line.startswith("delivery show") and re.search(r"status\s+sent", done.stdout):
                break
            time.sleep(0.5)
        assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    return seen


def stop_like_ctrl_c(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGINT to the first terminal's process group; every process in it must end."""
    group = proc.pid
    os.killpg(group, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(group, signal.SIGKILL)
    pytest.fail(f"Ctrl-C left processes running (killed now):\n{tail(log)}")


@contextlib.contextmanager
def run_example(
    title: str, folder: Path, env: dict[str, str], app_url: str, substitute: dict[str, str]
) -> Iterator[dict[str, str]]:
    first, second = section_blocks(title)[:2]
    for line, replacement in substitute.items():
        assert line in first and line in second, f"docs {title}: {line!r} is not in both"
        first, second = first.replace(line, replacement), second.replace(line, replacement)
    log = RUN_DIR / f"example-{title.lower()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", first],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_http(app_url, proc, log, timeout=420)  # a new virtualenv and pip install first
        yield run_second_terminal(second, folder, env)
    finally:
        if proc.poll() is None or _group_alive(proc.pid):
            stop_like_ctrl_c(proc, log)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def check_signup(seen: dict[str, str]) -> None:
    answer = json.loads(seen["curl"])
    assert answer["message_key"] == "signup-1:welcome", answer
    shown = seen["delivery"]
    assert re.search(r"status\s+sent", shown), shown
    assert "ann@example.com" not in shown  # the recipient is masked


def test_install_blocks_name_the_extras_the_examples_need() -> None:
    """Each example's first block creates a virtualenv and installs the project with the
    example's extra, then runs the example's run.sh, which exists and is executable."""
    for title, extra, script in (
        ("Flask", "flask", "examples/flask_app/run.sh"),
        ("Django", "django", "examples/django_app/run.sh"),
    ):
        first = section_blocks(title)[0]
        commands = [shlex.split(line, comments=True) for line in first.splitlines()]
        assert ["pip", "install", "-e", f".[{extra}]"] in commands, title
        assert [script] in commands, title
        assert os.access(ROOT / script, os.X_OK), script


def test_flask_example_runs_as_written(tmp_path: Path) -> None:
    """The Flask section's commands on a fresh copy: the signup's welcome email is sent by
    the worker through the stub provider that run.sh started, and Ctrl-C stops everything."""
    port, stub_port = free_port(), free_port()
    env = newcomer_env(PORT=str(port), STUB_PORT=str(stub_port))
    folder = fresh_copy(tmp_path / "clone")
    with run_example("Flask", folder, env, f"http://127.0.0.1:{port}/healthz", {}) as seen:
        check_signup(seen)


@pytest.fixture
def example_database() -> Iterator[str]:
    """A new, empty PostgreSQL database for the Django example (dropped afterwards)."""
    name = f"{PG_DB}_example"
    try:
        admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            conn.execute(text(f"CREATE DATABASE {name}"))
    except Exception as exc:
        need("PostgreSQL", exc)
    yield f"{PG_SERVER}/{name}"
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


def test_django_example_runs_as_written(tmp_path: Path, example_database: str) -> None:
    """The Django section's commands on a fresh copy and a new database: the signup's welcome
    email is sent, the admin's stylesheet is served, and Ctrl-C stops everything."""
    port, stub_port = free_port(), free_port()
    env = newcomer_env(PORT=str(port), STUB_PORT=str(stub_port))
    folder = fresh_copy(tmp_path / "clone")
    placeholder = (
        "export DELIVERY_DATABASE_URL=postgresql+psycopg://USER:PASSWORD@127.0.0.1:5432/DATABASE"
    )
    substitute = {placeholder: f"export DELIVERY_DATABASE_URL={example_database}"}
    url = f"http://127.0.0.1:{port}/admin/login/"
    with run_example("Django", folder, env, url, substitute) as seen:
        check_signup(seen)
        css = f"http://127.0.0.1:{port}/static/admin/css/base.css"
        with urllib.request.urlopen(css, timeout=5) as response:
            assert response.status == 200  # the admin is styled
