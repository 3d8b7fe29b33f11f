"""Which services a process uses (issue 12 §2): the embedded default only when nothing is
configured, a half-configured process refused at start-up naming the missing variable, and
Heroku-style ``postgres://`` URLs that work or fail in one line.

Unit tests on ``load_settings`` plus the real start-ups that read it: the ``delivery`` CLI,
``celery -A delivery.worker worker`` and an app process that imports ``delivery.worker`` (the
nudge)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from delivery.config.loading import load_settings
from delivery.config.urls import database_url_for
from delivery.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PG = "postgresql+psycopg://root@127.0.0.1:5432/x"


def test_nothing_set_is_the_embedded_default(tmp_path: Path) -> None:
    """With none of the service variables set, the outbox is SQLite and the broker a file
    broker in DELIVERY_HOME."""
    settings = load_settings({"DELIVERY_HOME": str(tmp_path)})
    assert settings.database_url == f"sqlite:///{tmp_path}/outbox.sqlite3"
    assert settings.broker_url == "filesystem://"
    assert settings.redis_url is None


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"DELIVERY_DATABASE_URL": PG}, "DELIVERY_BROKER_URL"),
        ({"DELIVERY_BROKER_URL": "redis://127.0.0.1:6379/0"}, "DELIVERY_DATABASE_URL"),
        ({"DELIVERY_REDIS_URL": "redis://127.0.0.1:6379/1"}, "DELIVERY_DATABASE_URL"),
        (
            {"DELIVERY_DATABASE_URL": PG, "DELIVERY_REDIS_URL": "redis://127.0.0.1:6379/1"},
            "DELIVERY_BROKER_URL",
        ),
    ],
)
def test_half_configured_names_the_missing_variable(given: dict[str, str], missing: str) -> None:
    """Any one service variable set without the database or the broker is a ConfigError naming
    the missing one and the one that was set, never a silent file broker or SQLite outbox."""
    with pytest.raises(ConfigError) as caught:
        load_settings(given)
    assert caught.value.key == missing
    assert next(iter(given)) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_database_and_broker_without_redis_is_complete() -> None:
    """Redis stays optional: a database and a broker are a whole configuration."""
    settings = load_settings({"DELIVERY_DATABASE_URL": PG, "DELIVERY_BROKER_URL": "amqp://h//"})
    assert (settings.database_url, settings.broker_url) == (PG, "amqp://h//")


@pytest.mark.parametrize("scheme", ["postgres", "postgresql"])
def test_heroku_style_urls_get_the_installed_driver(scheme: str) -> None:
    """``postgres://`` (Heroku) and a bare ``postgresql://`` become ``postgresql+psycopg://``
    (the driver this package installs), keeping user, password, host and database."""
    url = database_url_for(f"{scheme}://u:pw@db.example:5433/app?sslmode=require")
    assert url == "postgresql+psycopg://u:pw@db.example:5433/app?sslmode=require"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("not a url", "is not a database URL"),
        ("mongodb://h/db", "mongodb:// is not a database URL"),
        ("postgresql+nosuchdriver://h/db", "is not a database URL"),
        ("mysql+pymysql://h/db", "driver is not installed"),
    ],
)
def test_bad_database_url_is_one_line_without_the_password(url: str, words: str) -> None:
    """A URL SQLAlchemy cannot use fails with one line naming the variable, never echoing the
    URL (it may hold a password)."""
    secret = url.replace("://", "://user:hunter2@") if "://" in url else url + " hunter2"
    with pytest.raises(ConfigError) as caught:
        load_settings({"DELIVERY_DATABASE_URL": secret, "DELIVERY_BROKER_URL": "redis://h/0"})
    message = str(caught.value)
    assert caught.value.key == "DELIVERY_DATABASE_URL" and words in message
    assert "hunter2" not in message and "\n" not in message


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELIVERY_")}
    env.update(values)
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_half_configured_fails_in_one_line(tmp_path: Path) -> None:
    """``delivery stats`` with only a database URL exits non-zero with one line naming
    DELIVERY_BROKER_URL, no traceback, and writes no ./.delivery folder."""
    env = _env(DELIVERY_DATABASE_URL="postgres://root@127.0.0.1:5432/none")
    done = _run([sys.executable, "-m", "delivery.cli", "stats"], env, tmp_path)
    assert done.returncode != 0
    assert "DELIVERY_BROKER_URL" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / ".delivery").exists()


def test_app_importing_the_worker_half_configured_fails_at_import(tmp_path: Path) -> None:
    """An app process that imports ``delivery.worker`` (to install the nudge) with a database URL
    but no broker fails right there with a ConfigError naming DELIVERY_BROKER_URL, instead of
    publishing its messages to a file broker that no worker reads."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from delivery.errors import ConfigError\n"
        "try:\n    import delivery.worker\n"
        "except ConfigError as exc:\n    print(exc.key); sys.exit(3)\n"
        "sys.exit(0)\n"
    )
    env = _env(DELIVERY_DATABASE_URL=PG)
    done = _run([sys.executable, "-c", script, str(ROOT)], env, tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.strip() == "DELIVERY_BROKER_URL"
    assert not (tmp_path / ".delivery").exists()


def test_worker_half_configured_refuses_to_start(tmp_path: Path) -> None:
    """``celery -A delivery.worker worker`` with a broker but no database URL exits at start-up
    with one line naming DELIVERY_DATABASE_URL, no traceback (it does not start consuming)."""
    env = _env(DELIVERY_BROKER_URL="redis://127.0.0.1:1/0", PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "celery", "-A", "delivery.worker", "worker", "--pool", "solo"]
    done = _run(argv, env, tmp_path)
    assert done.returncode != 0
    assert "DELIVERY_DATABASE_URL" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / ".delivery").exists()


def test_hold_lease_must_be_below_send_lease(tmp_path: Path) -> None:
    """An explicit hold_lease not below send_lease is refused naming delivery.hold_lease; left
    to its default under a short send_lease it becomes half of it (a live send must not be
    taken for dead before send_lease)."""
    path = tmp_path / "delivery.toml"
    path.write_text("[delivery]\nsend_lease = 30\nhold_lease = 30\n")
    with pytest.raises(ConfigError) as caught:
        load_settings({"DELIVERY_CONFIG": str(path)})
    assert caught.value.key == "delivery.hold_lease"
    path.write_text(
        "[delivery]\nsend_lease = 9\n[timeouts]\nconnect = 1\nwrite = 1\nread = 1\npool = 1\n"
    )
    assert load_settings({"DELIVERY_CONFIG": str(path)}).hold_lease == 4.5
    assert load_settings({}).hold_lease == 10.0


def test_framework_database_without_broker_is_refused() -> None:
    """A Flask or Django app with no DELIVERY_* setting gets its own database as the outbox;
    without a broker that is half-configured too, and the error says so."""
    from delivery.contrib.settings import settings_from_config

    with pytest.raises(ConfigError) as caught:
        settings_from_config({}, environ={}, default_database_url=PG)
    assert caught.value.key == "DELIVERY_BROKER_URL"
    assert "the app's own database" in str(caught.value)
    settings = settings_from_config(
        {"DELIVERY_BROKER_URL": "redis://127.0.0.1:6379/0"}, environ={}, default_database_url=PG
    )
    assert settings.database_url == PG


def test_dispatch_lease_must_span_several_relay_passes(tmp_path: Path) -> None:
    """The relay renews queued tasks once a pass, so a dispatch_lease shorter than three relay
    intervals is refused naming delivery.dispatch_lease; the defaults pass."""
    path = tmp_path / "delivery.toml"
    path.write_text("[delivery]\nrelay_interval = 5\ndispatch_lease = 10\n")
    with pytest.raises(ConfigError) as caught:
        load_settings({"DELIVERY_CONFIG": str(path)})
    assert caught.value.key == "delivery.dispatch_lease"
    defaults = load_settings({})
    assert defaults.dispatch_lease >= 3 * defaults.relay_interval
