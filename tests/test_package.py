"""The package's shape: public API, layering, schema, and the linters."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, inspect, text

import delivery
from delivery.core.models import Base
from delivery.runtime.db import make_engine, upgrade

ROOT = Path(__file__).resolve().parents[1]


def test_public_api_is_pinned_and_sorted() -> None:
    """delivery's public names are exactly these, sorted."""
    assert delivery.__all__ == sorted(delivery.__all__)
    assert delivery.__all__ == [
        "Attempt",
        "ConfigError",
        "DeliveryError",
        "EnqueueArgs",
        "Enqueued",
        "IdempotencyConflict",
        "InvalidMessage",
        "Message",
        "MessageNotFound",
        "Outcome",
        "Settings",
        "Status",
        "Transition",
        "UnknownPolicy",
        "add_hook",
        "add_outcome_hook",
        "agent_key",
        "configure",
        "enqueue",
        "enqueue_many",
        "get_settings",
        "key",
        "load_settings",
        "remove_outcome_hook",
    ]


def test_library_does_not_import_celery() -> None:
    """delivery/ is framework-free: importing all of it but its Celery room
    (``delivery.worker``) loads no Celery."""
    code = (
        "import sys, pkgutil, importlib, delivery, django\n"
        "from django.conf import settings\n"  # delivery.contrib.django's models need an app
        "settings.configure(DELIVERY_NUDGE=False, DELIVERY_DATABASE_URL='sqlite://',\n"
        "    INSTALLED_APPS=['django.contrib.admin', 'django.contrib.auth',\n"
        "    'django.contrib.contenttypes', 'django.contrib.messages',\n"
        "    'delivery.contrib.django'])\n"
        "django.setup()\n"
        "def skip(name): return '.migrations' in name or name.startswith('delivery.worker')\n"
        "def walk(path, prefix):\n"
        "    for m in pkgutil.iter_modules(path, prefix):\n"
        "        if skip(m.name): continue\n"
        "        module = importlib.import_module(m.name)\n"
        "        if m.ispkg: walk(module.__path__, m.name + '.')\n"
        "walk(delivery.__path__, 'delivery.')\n"
        "assert 'celery' not in sys.modules, 'celery imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_migrations_match_models(tmp_path: Path) -> None:
    """The shipped Alembic migration creates the same columns and indexes as the models."""
    engine = make_engine(f"sqlite:///{tmp_path}/m.sqlite3")
    upgrade(engine)
    inspector = inspect(engine)
    for table in Base.metadata.sorted_tables:
        migrated = {c["name"] for c in inspector.get_columns(table.name)}
        assert migrated == set(table.columns.keys()), table.name
        # SQLite keeps the key's unique constraint of 0001 (the model's unique index).
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        indexes |= {u["name"] for u in inspector.get_unique_constraints(table.name)}
        assert {i.name for i in table.indexes} <= indexes, table.name


@pytest.mark.integration
def test_postgres_migrations_build_exactly_the_models_indexes(pg_engine: Engine) -> None:
    """On PostgreSQL the migrated tables have exactly the indexes the models declare, each
    with the same definition (columns, uniqueness, operator class, predicate): the models
    are created in a schema of their own and the two are compared. (The migrations' shape;
    ``delivery db upgrade`` then partitions a new outbox by day: tests/test_partitions.)"""
    from tests.conftest import own_database

    with own_database("models") as flat:
        upgrade(flat, partition=False)
        _compare_indexes(flat)


def _compare_indexes(pg_engine: Engine) -> None:

    def definitions(schema: str) -> dict[str, set[str]]:
        rows = conn.execute(
            text("SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = :s"),
            {"s": schema},
        ).all()
        found: dict[str, set[str]] = {}
        for table, definition in rows:
            found.setdefault(table, set()).add(definition.replace(f" {schema}.", " "))
        return found

    with pg_engine.begin() as conn:
        conn.execute(text("DROP SCHEMA IF EXISTS model_check CASCADE"))
        conn.execute(text("CREATE SCHEMA model_check"))
        try:
            mapped = conn.execution_options(schema_translate_map={None: "model_check"})
            Base.metadata.create_all(mapped)
            declared, migrated = definitions("model_check"), definitions("public")
        finally:
            conn.execute(text("DROP SCHEMA model_check CASCADE"))
    for table in Base.metadata.sorted_tables:
        assert migrated[table.name] == declared[table.name], table.name


def test_ruff_and_mypy_are_clean() -> None:
    """The code passes ruff and strict mypy as configured in pyproject.toml."""
    for argv in (["ruff", "check", "delivery", "tasks", "tests"], ["mypy"]):
        result = subprocess.run(
            [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr


def pip_install_targets(text: str) -> list[str]:
    """The requirement arguments of every ``pip install`` command in ``text`` (options and
    what follows a shell operator left out)."""
    import shlex

    targets: list[str] = []
    for match in re.finditer(r"pip install ([^\n`]*)", text):
        try:
            words = shlex.split(match.group(1), comments=True)
        except ValueError:  # a quote closed on the next line: not a command
            continue
        for word in words:
            if word in ("&&", ";", "|", "||", "\\"):
                break
            if not word.startswith("-"):
                targets.append(word)
    return targets


def test_install_commands_name_this_distribution() -> None:
    """Every ``pip install`` the project tells a user to run (README, docs, bench, deploy, compose,
    examples, messages in the package) installs this checkout (``.``) or the distribution
    pyproject names, never another project's (``delivery`` on the index is someone else's),
    with extras that pyproject declares; the distribution is installed under that name."""
    import importlib.metadata
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name, extras = project["name"], set(project["optional-dependencies"])
    assert name == "delivery-outbox"
    assert importlib.metadata.version(name) == project["version"]
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "README.md"]
    files += [*sorted((ROOT / "docs").glob("*.md")), ROOT / "docker-compose.yml"]
    files += sorted((ROOT / "deploy").iterdir()) + sorted((ROOT / "examples").rglob("*"))
    files += sorted((ROOT / "delivery").rglob("*.py"))
    seen: dict[str, list[str]] = {}
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            for target in pip_install_targets(path.read_text(errors="replace")):
                seen.setdefault(target, []).append(str(path.relative_to(ROOT)))
    assert "'delivery-outbox[flask]'" not in seen  # shlex took the quotes off
    assert {"delivery-outbox[flask]", "delivery-outbox[django]", ".[flask]"} <= set(seen)
    for target, where in seen.items():
        dist = re.match(r"[A-Za-z0-9._-]*", target)
        assert dist is not None
        named = re.sub(r"[-_.]+", "-", dist.group(0)).lower()
        if named in ("", ".") or "delivery" in named:
            assert named in ("", ".", name), f"{where}: pip install {target} is not {name}"
            wanted = re.search(r"\[([^\]]*)\]", target)
            for extra in wanted.group(1).split(",") if wanted else []:
                assert extra in extras, f"{where}: extra {extra!r} of {target}"


def test_the_readme_install_lines_are_checked() -> None:
    """The check above can fail: the README's old line names another project."""
    for bad in ("pip install 'delivery[flask]'", "pip install delivery_outbox2"):
        [target] = pip_install_targets(bad)
        named = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]*", target).group(0)).lower()  # type: ignore[union-attr]
        assert named != "delivery-outbox"


def test_a_missing_extra_names_the_install_command() -> None:
    """Importing the Flask or Django integration without its framework fails with the pip
    command of this distribution's extra."""
    for module, extra in (
        ("delivery.contrib.flask", "flask"),
        ("delivery.contrib.django", "django"),
    ):
        blocked = extra
        code = f"import sys; sys.modules[{blocked!r}] = None; import {module}"
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode != 0
        assert f"pip install 'delivery-outbox[{extra}]'" in result.stderr, result.stderr
