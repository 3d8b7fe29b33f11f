"""The documentation holds: the README is an entry page, every relative link and anchor
resolves, and the README's production sequence runs as pasted.

The production sequence is the README's blocks marked ``<!-- test: production -->``, in
order: ``sh`` blocks are typed into one bash, as a person pastes them into one terminal, and
the ``python`` block is the app example, saved as ``app.py`` (the README says so). They run
from a wheel of this checkout installed in a fresh virtualenv, against a PostgreSQL database
the sequence itself creates (``createdb``) and drops afterwards. Only the environment points
it at the suite's services, through the variables the blocks read with ``${VAR:-default}``:
``PGHOST``/``PGPORT``/``PGUSER`` (the suite's server), ``PGDATABASE`` (a new, unique name),
``DELIVERY_BROKER_URL``/``DELIVERY_REDIS_URL`` (both this slot's state db: a broker no other
worker of the suite consumes). Between the first two blocks the test does what the README
tells the reader to do there to try the setup first:
route every channel to ``[providers.stub]``, keep only that provider, and start the stub
provider it points at (here on a free port).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import unicodedata
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.conftest import (
    OWN_BROKER_URL,
    PG_DB,
    PG_SERVER,
    REDIS_URL,
    RUN_DIR,
    free_port,
    need,
)
from tests.test_examples import newcomer_env, tail

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS += [ROOT / "bench" / "README.md", ROOT / "bench" / "RELIABILITY.md"]
QUICK_START = (
    "pip install -e . && delivery demo",
    "pip install -e '.[test]' && pytest",
)
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
STOP = "kill $(jobs -p)"  # the README's way to stop what the blocks started
MARKED = re.compile(r"<!-- test: production -->\n```(\w+)\n(.*?)```", re.S)


# --- the README is an entry page ----------------------------------------------------------


def test_readme_is_at_most_200_lines() -> None:
    """The README is an entry page; the rest lives in docs/."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"


def test_install_and_quick_start_are_in_the_first_60_lines() -> None:
    """A newcomer sees how to install and the quick start's two commands on the first
    screens: a ``pip install`` line and both quick start lines, exactly as runnable."""
    head = README.read_text().splitlines()[:60]
    assert any(line.startswith("pip install -e .") for line in head), "no pip install"
    for command in QUICK_START:
        assert any(line.startswith(command) for line in head), command


# --- links and anchors --------------------------------------------------------------------


def prose_lines(markdown: str) -> Iterator[str]:
    """The lines outside fenced code blocks."""
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, every character but
    letters, marks, digits, ``_``, ``-`` and spaces dropped, spaces made hyphens."""
    rendered = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    kept = "".join(
        c for c in rendered.strip().lower() if c in " -_" or unicodedata.category(c)[0] in "LMN"
    )
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, a repeated heading numbered as GitHub does."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose_lines(path.read_text()):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` (outside code) whose file or anchor does not exist."""
    broken: list[str] = []
    for line in prose_lines(path.read_text()):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists():
                broken.append(f"{target} (no such file)")
            elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
                broken.append(f"{target} (no such anchor)")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc: Path) -> None:
    """Each link to a file of the repository names one that exists, and each #anchor a
    heading of that file, as GitHub spells it."""
    assert doc.exists(), doc
    assert broken_links(doc) == [], doc.name


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    """The checker reports a missing file and a missing anchor, finds GitHub's anchors
    (punctuation dropped, repeats numbered), and ignores links inside code."""
    (tmp_path / "other.md").write_text("# Other\n\n## A (`b`) c's\n\n## A (`b`) c's\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-b-cs) [again](other.md#a-b-cs-1) [self](#page)\n# Page\n"
        "[gone](missing.md) [no anchor](other.md#nope) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nope (no such anchor)"]
    assert slug("Circuit breaker (`python -m bench.breaker`)") == (
        "circuit-breaker-python--m-benchbreaker"
    )


# --- the production sequence, as pasted -----------------------------------------------------


def production_blocks() -> list[tuple[str, str]]:
    """The README's marked blocks, in order, as (language, text)."""
    return MARKED.findall(README.read_text())


def test_the_production_sequence_is_marked_and_complete() -> None:
    """The marked blocks create the database, write the configuration, migrate, start the
    worker and exactly one beat in the background, and send from the app example."""
    blocks = production_blocks()
    shell = "\n".join(body for lang, body in blocks if lang == "sh")
    python = [body for lang, body in blocks if lang == "python"]
    assert len(python) == 1, "one app example"
    for needed in (
        'createdb "$PGDATABASE"',
        "delivery config example > delivery.toml",
        "export DELIVERY_CONFIG=$PWD/delivery.toml",
        "delivery db upgrade",
        "python app.py",
    ):
        assert needed in shell, needed
    background = [line for line in shell.splitlines() if line.startswith("celery -A")]
    assert [line.split("#")[0].split()[3] for line in background] == ["worker", "beat"]
    assert all(line.split("#")[0].rstrip().endswith("&") for line in background)


@pytest.fixture
def new_database() -> Iterator[str]:
    """A unique database name, not yet created (the sequence creates it); dropped after."""
    name = f"{PG_DB}_prod_{uuid.uuid4().hex[:8]}"
    try:
        admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        need("PostgreSQL", exc)
    yield name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def flush_redis() -> None:
    import redis

    for url in {OWN_BROKER_URL, REDIS_URL}:
        if url.startswith("redis"):
            redis.Redis.from_url(url).flushdb()


class Terminal:
    """One bash reading pasted lines from its standard input, as a terminal's shell does,
    in a session of its own (so that every process it starts can be found and stopped)."""

    def __init__(self, folder: Path, env: dict[str, str], log: Path) -> None:
        self.folder, self.log, self.step = folder, log, 0
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "-e"],
                cwd=folder,
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def paste(self, block: str, timeout: float) -> None:
        """Type ``block``, then wait until bash has run it (or fail with its output)."""
        self.step += 1
        done = self.folder / f".pasted-{self.step}"
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{block}\n: > {done.name}\n".encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while not done.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"the shell ended ({self.proc.returncode}):\n{tail(self.log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"block {self.step} did not finish in {timeout} s:\n{tail(self.log)}")
            time.sleep(0.2)

    def environment(self) -> dict[str, str]:
        """The shell's exported variables now (what the pasted ``export`` lines set)."""
        self.paste("env -0 > .shell-env", timeout=30)
        raw = (self.folder / ".shell-env").read_bytes().split(b"\0")
        return dict(item.decode().split("=", 1) for item in raw if b"=" in item)

    def alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def close(self, stop: str) -> None:
        """Type ``stop`` and ``exit``; every process of the session must then end."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(f"{stop}\nwait\nexit\n".encode())
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)
        deadline = time.monotonic() + 30
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        if self.alive():
            self.kill()
            pytest.fail(f"`{stop}` left processes running (killed now):\n{tail(self.log)}")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
            return
        time.sleep(0.2)
    pytest.fail(f"{url} did not answer within {timeout} s")


def try_with_the_stub(config: Path, url: str) -> None:
    """What the README says to do between the blocks to try the setup first: every channel's
    ``provider = "stub"``, only ``[providers.stub]`` kept (here pointed at the test's stub)."""
    kept: list[str] = []
    section = ""
    for line in config.read_text().splitlines():
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            section = header.group(1).strip()
        parts = section.split(".")
        if parts[0] == "providers" and parts[1:2] != ["stub"]:
            continue  # a provider the trial does not use
        if parts[0] == "channels" and len(parts) == 2 and re.match(r"provider\s*=", line):
            line = 'provider = "stub"'
        if section == "providers.stub" and re.match(r"base_url\s*=", line):
            line = f'base_url = "{url}"'
        kept.append(line)
    edited = "\n".join(kept) + "\n"
    settings = tomllib.loads(edited)
    assert settings["providers"]["stub"]["base_url"] == url, edited
    assert settings["channels"]["sms"]["provider"] == "stub", edited
    config.write_text(edited)


def status(folder: Path, env: dict[str, str]) -> str | None:
    """The message's status as ``delivery show --json`` reports it (None: not shown)."""
    shown = subprocess.run(
        ["delivery", "show", "--json", "signup-1:otp"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    if shown.returncode != 0:
        return None
    return str(json.loads(shown.stdout)["status"])


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_the_production_sequence_runs_as_pasted(
    tmp_path: Path, built_wheel: Path, new_database: str
) -> None:
    """From a wheel in a fresh virtualenv, the README's production blocks create and migrate
    a database, start a worker and one beat in the background, and the app example's message
    is sent through the provider exactly once; the README's stop command ends every process."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(built_wheel)],
        check=True,
        env=newcomer_env(),
    )
    server = make_url(PG_SERVER)
    env = newcomer_env(
        VIRTUAL_ENV=str(venv),
        PGHOST=server.host or "127.0.0.1",
        PGPORT=str(server.port or 5432),
        PGUSER=server.username or "",
        PGDATABASE=new_database,
        DELIVERY_BROKER_URL=OWN_BROKER_URL,
        DELIVERY_REDIS_URL=REDIS_URL,
    )
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    if server.password:
        env["PGPASSWORD"] = server.password
    try:
        flush_redis()
    except Exception as exc:
        need("Redis", exc)
    blocks = production_blocks()
    shell = [body for lang, body in blocks if lang == "sh"]
    [app] = [body for lang, body in blocks if lang == "python"]
    folder = tmp_path / "terminal"
    folder.mkdir()
    (folder / "app.py").write_text(app)
    stub_port = free_port()
    stub_log = RUN_DIR / "docs-stub.log"
    with stub_log.open("wb") as out:
        stub = subprocess.Popen(
            [str(venv / "bin" / "delivery"), "stub-provider", "--port", str(stub_port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    terminal = Terminal(folder, env, RUN_DIR / "docs-production.log")
    try:
        stub_url = f"http://127.0.0.1:{stub_port}"
        wait_http(f"{stub_url}/_stub/effects", timeout=60)
        terminal.paste(shell[0], timeout=300)  # database, configuration, migration
        try_with_the_stub(folder / "delivery.toml", stub_url)
        for block in shell[1:]:
            terminal.paste(block, timeout=120)  # worker and beat, then the app
        exported = terminal.environment()  # what the pasted lines exported
        assert status(folder, exported) is not None  # `delivery show` finds the message
        deadline = time.monotonic() + 30  # the nudge sends it at once: seconds, not a lease
        while status(folder, exported) != "sent":
            if time.monotonic() > deadline:
                pytest.fail(f"signup-1:otp was not sent:\n{tail(terminal.log)}")
            time.sleep(0.5)
        with urllib.request.urlopen(f"{stub_url}/_stub/effects", timeout=5) as response:
            assert json.load(response)["effects"] == {"signup-1:otp": 1}
        assert f"`{STOP}`" in README.read_text()
        terminal.close(STOP)  # the README's stop command
    finally:
        if terminal.alive():
            terminal.kill()
        stub.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            stub.wait(10)
        if stub.poll() is None:
            stub.kill()
        flush_redis()
