"""What operators saw the CLI do wrong, each fixed: keys split by table wrapping in a pipe,
``watch`` silent without a terminal, ``db upgrade`` advice and report, tuples in messages,
``prune --help`` without ``expired``, ``half_open``, and the attempt log after a redrive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy.orm import Session

from delivery.cli import main
from delivery.config.loading import settings_from_mapping
from delivery.config.settings import BreakerConfig
from delivery.errors import ConfigError, InvalidMessage
from delivery.guards.breaker import CircuitBreaker, Verdict
from delivery.guards.redis_client import redis_client as make_client
from delivery.outbox.validation import check_payload
from tests.conftest import PG_SERVER, REDIS_URL
from tests.factories import add, add_attempt

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, **kw: Any) -> Result:
    return CliRunner().invoke(main, list(args), **kw)


def test_piped_tables_keep_long_keys_whole(session: Session) -> None:
    """Without a terminal (a pipe, cron), a 200-character key is printed on one line, whole,
    by ``dead`` and ``show``."""
    key = "tenant-" + "x" * 180 + ":receipt-long"
    add(session, key, "dead", last_error_code="21211")
    for args in (["dead"], ["show", key]):
        result = run(*args)
        assert result.exit_code == 0, result.output
        assert any(key in line for line in result.output.splitlines()), result.output


def test_watch_without_a_terminal_prints_frames_before_sigint(db_url: str) -> None:
    """``delivery watch`` into a pipe prints its first frame right away (not at Ctrl-C) and
    exits cleanly on SIGINT."""
    env = dict(os.environ, DELIVERY_DATABASE_URL=db_url, DELIVERY_REDIS_URL="")
    proc = subprocess.Popen(
        [sys.executable, "-m", "delivery.cli", "watch", "--interval", "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        seen = b""
        deadline = time.monotonic() + 30
        while b"delivery outbox at" not in seen and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line
        assert b"delivery outbox at" in seen, seen
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)


def test_db_upgrade_says_what_it_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ``db upgrade`` lists each migration it applied; the second says there was
    nothing to apply."""
    monkeypatch.setenv("DELIVERY_DATABASE_URL", f"sqlite:///{tmp_path}/u.sqlite3")
    first = run("db", "upgrade")
    assert first.exit_code == 0, first.output
    assert "applied 0001" in first.output and "applied 0003_fence" in first.output
    assert "applied 0004_audit: Audit" in first.output
    second = run("db", "upgrade")
    assert "nothing to apply" in second.output and "applied" not in second.output


def test_db_upgrade_on_a_missing_database_does_not_suggest_db_upgrade(
    pg_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a database that does not exist, ``db upgrade`` exits 2 naming the URL and
    saying to create it, never to run ``db upgrade``."""
    missing = f"nodb_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("DELIVERY_DATABASE_URL", f"{PG_SERVER}/{missing}")
    result = run("db", "upgrade")
    assert result.exit_code == 2
    assert missing in result.output and "create the database" in result.output
    assert "db upgrade" not in result.output


def test_prune_help_names_every_final_status() -> None:
    """``prune --help`` lists expired among the final statuses it deletes."""
    result = run("prune", "--help")
    for status in ("sent", "dead", "unknown", "cancelled", "expired"):
        assert status in result.output


def test_messages_name_choices_without_python_tuples() -> None:
    """Errors list their choices as words (``one of body``), never a Python tuple."""
    with pytest.raises(InvalidMessage) as caught:
        check_payload("sms", {"body": ""}, 1000)
    assert "needs one of body)" in str(caught.value) and "('" not in str(caught.value)
    with pytest.raises(ConfigError) as config:
        settings_from_mapping(
            {"channels": {"fax": {}}}, database_url="sqlite://", broker_url="x", redis_url=None
        )
    assert "email, sms, webhook" in str(config.value) and "('" not in str(config.value)


def test_breaker_status_prints_half_open_as_the_readme_writes_it(
    redis_client: Any, tmp_path: Path
) -> None:
    """A breaker in its half-open state shows as ``half-open`` in the table and in JSON."""
    name = f"ho{uuid.uuid4().hex[:6]}"
    config = tmp_path / "b.toml"
    config.write_text(
        f'[providers.{name}]\nkind = "http"\nbase_url = "http://127.0.0.1:9"\n'
        f"[providers.{name}.breaker]\nfailure_threshold = 1\nreset_timeout = 0.05\n"
    )
    breaker = CircuitBreaker(
        name,
        BreakerConfig(failure_threshold=1, reset_timeout=0.05),
        client=make_client(REDIS_URL),
    )
    try:
        breaker.record(breaker.allow(), Verdict.FAILURE)
        time.sleep(0.2)
        probe = breaker.allow()
        assert probe.state == "half_open"
        env = {"DELIVERY_CONFIG": str(config), "DELIVERY_REDIS_URL": REDIS_URL}
        table = run("breaker", "status", env=env)
        assert "half-open" in table.output and "half_open" not in table.output
        as_json = run("breaker", "status", "--json", env=env)
        assert '"half-open"' in as_json.output
    finally:
        breaker.reset()


def test_show_after_a_redrive_numbers_attempts_across_rounds(session: Session) -> None:
    """After a redrive, ``show`` numbers the two provider calls 1 and 2 (each "try 1" of its
    round) and prints the redrive, with its actor, between them."""
    message = add(session, "again-1", "dead", attempts=1)
    add_attempt(session, message.id, "permanent", -10)
    assert run("redrive", "again-1").exit_code == 0
    add_attempt(session, message.id, "delivered", 1)
    lines = run("show", "again-1").output.splitlines()
    rows = [line for line in lines if "try 1" in line or "redrive by cli:" in line]
    assert len(rows) == 3, "\n".join(lines)
    assert "permanent" in rows[0] and "redrive by cli:" in rows[1] and "delivered" in rows[2]
    assert rows[0].split()[1] == "1" and rows[2].split()[1] == "2"
