"""The deployment files: docker-compose.yml, deploy/Dockerfile, deploy/env.example/,
deploy/make_env.py, deploy/flowerconfig.py and deploy/delivery.toml. Docker does not run
here: compose is validated by Debian's ``docker-compose config -q`` and every command it runs
is checked against our CLI and Celery's."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from delivery.config.loading import load_settings
from delivery.console import parse_users
from delivery.providers.secrets import check_secrets
from delivery.providers.webhook import decode_secrets
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ENV_EXAMPLE = ROOT / "deploy" / "env.example"
SERVICES = {
    "console",
    "postgres",
    "redis",
    "migrate",
    "worker",
    "beat",
    "flower",
    "receiver",
    "stub",
    "app",
    "otel-collector",
    "jaeger",
}
#: The services of the optional ``tracing`` profile (their images have no shell to check with).
TRACING = {"otel-collector", "jaeger"}
ENV_DIR = "${DELIVERY_ENV_DIR:-deploy/env.example}/"
# Which env files (so which secrets) each service gets: each only what it needs.
ENV_FILES = {
    "postgres": {"postgres.env"},
    "redis": {"redis.env"},
    "migrate": {"delivery.env", "database.env"},
    "worker": {"delivery.env", "database.env", "broker.env", "providers.env", "tracing.env"},
    "beat": {"delivery.env", "database.env", "broker.env", "tracing.env"},
    "flower": {"delivery.env", "broker.env", "flower.env"},
    "stub": set(),
    "console": {"delivery.env", "database.env", "broker.env", "console.env"},
    "receiver": {"delivery.env", "database.env", "receipts.env", "tracing.env"},
    "app": {"delivery.env", "database.env", "broker.env", "app.env"},
    "otel-collector": set(),
    "jaeger": set(),
}


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def read_env(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f"not NAME=value: {line!r}"
            values[name] = value
    return values


def env_files(folder: Path = ENV_EXAMPLE) -> dict[str, dict[str, str]]:
    """Each env file of a folder (deploy/env.example/ by default) by name."""
    return {path.name: read_env(path) for path in sorted(folder.glob("*.env"))}


def env_example() -> dict[str, str]:
    """Every variable of deploy/env.example/ in one mapping."""
    merged: dict[str, str] = {}
    for values in env_files().values():
        merged.update(values)
    return merged


def service_env_files(service: dict[str, Any]) -> set[str]:
    files = service.get("env_file", [])
    files = [files] if isinstance(files, str) else files
    assert all(f.startswith(ENV_DIR) for f in files), files
    return {f.removeprefix(ENV_DIR) for f in files}


def argv_of(value: str | list[str]) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def commands() -> list[tuple[str, list[str]]]:
    """Every command the compose file runs: each service's command and health check (a
    ``sh -c`` script's last command, the one it ``exec``s)."""
    found = []
    for name, service in compose()["services"].items():
        if "command" in service:
            argv = argv_of(service["command"])
            if argv[:2] == ["sh", "-c"]:
                argv = shlex.split(argv[2].rpartition("exec ")[2])
            found.append((name, argv))
        test = service.get("healthcheck", {}).get("test")
        if test:
            kind, *rest = test
            assert kind in ("CMD", "CMD-SHELL"), f"{name}: health check {kind}"
            found.append((f"{name} healthcheck", rest if kind == "CMD" else shlex.split(rest[0])))
    return found


def check_delivery(argv: list[str]) -> None:
    """Resolve ``delivery SUB...`` through click's command tree and parse the leaf's options."""
    from delivery.cli import main

    command: click.Command = main
    ctx = click.Context(main, info_name="delivery")
    args = argv[1:]
    while isinstance(command, click.Group):
        assert args, f"{argv}: {ctx.command_path} needs a subcommand"
        name, *args = args
        sub = command.get_command(ctx, name)
        assert sub is not None, f"{argv}: no command {name!r} in {ctx.command_path}"
        command = sub
        ctx = click.Context(command, info_name=name, parent=ctx)
    command.make_context(ctx.info_name, args, parent=ctx.parent)


def check_celery(argv: list[str]) -> None:
    """``celery -A tasks SUB ...``: the app is ours and SUB parses its options in Celery."""
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery

    import tasks

    assert argv[1:3] == ["-A", "tasks"], f"{argv}: expected celery -A tasks"
    assert tasks.app.main == "delivery"
    name, *args = argv[3:]
    sub = celery.commands.get(name)
    assert sub is not None, f"{argv}: celery has no {name!r} command"
    obj = CLIContext(app=tasks.app, no_color=True, workdir=None, quiet=True)
    sub.make_context(name, args, parent=click.Context(celery, info_name="celery", obj=obj))
    for arg in args:
        if arg.startswith("--conf="):
            assert (ROOT / arg.removeprefix("--conf=")).is_file(), f"{argv}: no {arg}"


def check_python(argv: list[str]) -> None:
    """``python -m MODULE`` runs a module of this repository; ``python -c`` is left alone."""
    if argv[1] == "-m":
        assert importlib.util.find_spec(argv[2]) is not None, f"{argv}: no module {argv[2]}"
    else:
        assert argv[1] == "-c", argv


def test_compose_file_is_valid_for_docker_compose() -> None:
    """``docker-compose config -q`` accepts docker-compose.yml with its default env file."""
    binary = shutil.which("docker-compose")
    if binary is None:
        message = "docker-compose is not installed (apt-get install docker-compose)"
        if IN_CI:
            pytest.fail(f"{message}; CI=true requires it")
        pytest.skip(message)
    env = {k: v for k, v in os.environ.items() if k != "DELIVERY_ENV_DIR"}
    result = subprocess.run(
        [binary, "-f", str(COMPOSE), "config", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_command_the_compose_file_runs_exists() -> None:
    """Each service command and health check is a ``delivery`` command, a ``celery -A tasks``
    subcommand, a module of this repository, or a tool of the image it runs in, and parses."""
    images = {name: s.get("image", "") for name, s in compose()["services"].items()}
    seen = set()
    for where, argv in commands():
        service = where.split()[0]
        program = argv[0]
        seen.add(program)
        if program == "delivery":
            check_delivery(argv)
        elif program == "celery":
            check_celery(argv)
        elif program == "python":
            check_python(argv)
        elif program in ("pg_isready", "redis-cli", "redis-server"):
            assert images[service].split(":")[0] in ("postgres", "redis"), where
        else:
            pytest.fail(f"{where}: unknown program {program!r}")
    assert {"delivery", "celery", "python"} <= seen


def test_command_check_rejects_what_does_not_exist() -> None:
    """The checks above fail on a missing delivery command, a bad option or a missing
    celery subcommand (so a typo in the compose file cannot pass)."""
    with pytest.raises(AssertionError):
        check_delivery(["delivery", "db", "upgrad"])
    with pytest.raises(click.NoSuchOption):
        check_delivery(["delivery", "stub-provider", "--hots", "0.0.0.0"])
    with pytest.raises(click.BadParameter):
        check_delivery(["delivery", "stub-provider", "--port", "99999"])
    with pytest.raises(AssertionError):
        check_celery(["celery", "-A", "tasks", "wroker"])
    with pytest.raises(click.NoSuchOption):
        check_celery(["celery", "-A", "tasks", "beat", "--replicas", "2"])


def test_compose_shape_one_beat_migrate_first_health_checks_and_auth() -> None:
    """All services exist; beat is one replica; the migration runs once before the app,
    workers, beat and Flower; long-running services have health checks; Flower's credentials
    and all settings come from the env file, never from the compose file."""
    data = compose()
    services = data["services"]
    assert set(services) == SERVICES
    assert services["migrate"]["command"] == ["delivery", "db", "upgrade"]
    assert services["migrate"]["restart"] == "no"
    assert services["beat"]["deploy"]["replicas"] == 1
    assert "scale" not in services["beat"]
    assert "container_name" not in services["worker"], "a fixed name prevents --scale"
    for name in ("worker", "beat", "flower", "app", "console"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["postgres"]["condition"] == "service_healthy", name
    for name in SERVICES - {"migrate", "beat"} - TRACING:
        assert "healthcheck" in services[name], name
    for name in TRACING:  # optional: only with --profile tracing
        assert services[name]["profiles"] == ["tracing"], name
    assert services["stub"]["command"] == [
        "delivery", "stub-provider", "--host", "0.0.0.0", "--port", "9090"
    ]  # fmt: skip
    assert "FLOWER_BASIC_AUTH" in env_example()
    # The console is reachable from the host's loopback only, and has operators configured.
    assert services["console"]["ports"] == ["127.0.0.1:8025:8025"]
    assert services["console"]["command"][:2] == ["delivery", "console"]
    parse_users(env_example())
    text = COMPOSE.read_text()
    assert "change-me" not in text and "password:" not in text.lower()


def test_each_service_gets_only_the_secrets_it_needs() -> None:
    """Each service reads only its own env files: provider secrets reach the worker alone,
    Flower's credentials Flower alone, the console's operators the console alone, the database
    and Redis passwords only the services that connect to them; every variable of the example
    folder is given to some service."""
    services = compose()["services"]
    given = {name: service_env_files(service) for name, service in services.items()}
    assert given == ENV_FILES
    files = env_files()
    assert set(files) == set().union(*ENV_FILES.values())
    holders = {f: {s for s, fs in ENV_FILES.items() if f in fs} for f in files}
    assert holders["providers.env"] == {"worker"}
    assert holders["flower.env"] == {"flower"}
    assert holders["console.env"] == {"console"}
    assert holders["receipts.env"] == {"receiver"}
    assert holders["postgres.env"] == {"postgres"} and holders["redis.env"] == {"redis"}
    assert "flower" not in holders["database.env"] and "stub" not in set().union(*holders.values())
    assert "FLOWER_BASIC_AUTH" in files["flower.env"] and "REDIS_PASSWORD" in files["redis.env"]
    secretish = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH|_KEY")
    for name, values in files.items():
        if name not in ("postgres.env", "redis.env", "flower.env", "console.env", "receipts.env"):
            assert not any(secretish.search(v) for v in values), name


def test_published_ports_are_on_loopback_only() -> None:
    """Flower, the console, the receipt receiver and the example app are published on the
    host's 127.0.0.1, nothing on all interfaces."""
    published = {
        name: service["ports"]
        for name, service in compose()["services"].items()
        if "ports" in service
    }
    assert set(published) == {"flower", "console", "receiver", "app", "jaeger"}
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_redis_requires_a_password_and_every_url_carries_it() -> None:
    """Redis starts only with REDIS_PASSWORD (16+ characters) as requirepass, its health check
    authenticates, and the broker and breaker URLs carry that password; the database URLs carry
    the PostgreSQL password."""
    redis = compose()["services"]["redis"]
    script = argv_of(redis["command"])[2]
    assert "--requirepass" in script and "$${#REDIS_PASSWORD} -ge 16" in script
    assert "REDIS_PASSWORD" in redis["healthcheck"]["test"][1]
    files = env_files()
    password = files["redis.env"]["REDIS_PASSWORD"]
    for name in ("DELIVERY_BROKER_URL", "DELIVERY_REDIS_URL"):
        assert files["broker.env"][name].startswith(f"redis://:{password}@redis:6379/"), name
    pg = files["postgres.env"]["POSTGRES_PASSWORD"]
    assert f":{pg}@postgres:5432/" in files["database.env"]["DELIVERY_DATABASE_URL"]


def flower_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, auth: str | None) -> Any:
    """Execute deploy/flowerconfig.py as Flower does, with FLOWER_BASIC_AUTH = ``auth``."""
    import runpy

    monkeypatch.setenv("FLOWER_DB", str(tmp_path / "flower.db"))
    if auth is None:
        monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    else:
        monkeypatch.setenv("FLOWER_BASIC_AUTH", auth)
    return runpy.run_path(str(ROOT / "deploy" / "flowerconfig.py"))


@pytest.mark.parametrize(
    "auth",
    [
        None,
        "",
        "ops",
        "ops:change-me",
        "ops:short-pass",
        "ops:please-change-me-now",
        "ops:Password12345",
        "operator-account:operator-account",
        "ops:4f9c2e7a1b3d5f60aa, admin:admin",
    ],
)
def test_flower_refuses_a_missing_placeholder_or_short_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, auth: str | None
) -> None:
    """deploy/flowerconfig.py stops Flower without credentials, with a password under 12
    characters, equal to the user name or containing a placeholder word, and never prints it."""
    with pytest.raises(SystemExit) as stop:
        flower_config(monkeypatch, tmp_path, auth)
    message = str(stop.value.code)
    assert "FLOWER_BASIC_AUTH" in message
    for credential in (auth or "").split(","):
        password = credential.partition(":")[2].strip()
        if len(password) > 3:
            assert password not in message
        assert credential.partition(":")[0] not in message or not credential


def test_make_env_writes_a_folder_compose_and_flower_accept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """deploy/make_env.py fills every placeholder with random passwords (owner-only files,
    consistent between redis.env and the URLs), Flower accepts its credentials, the receiver
    its receipts' secret, and docker-compose validates the file with DELIVERY_ENV_DIR
    pointing at it."""
    import runpy

    target = tmp_path / "env"
    runpy.run_path(str(ROOT / "deploy" / "make_env.py"), run_name="make_env")["main"](target)
    files = env_files(target)
    assert set(files) == set(env_files())
    assert "change-me" not in "".join(p.read_text() for p in target.iterdir())
    assert all(p.stat().st_mode & 0o077 == 0 for p in target.iterdir())
    password = files["redis.env"]["REDIS_PASSWORD"]
    assert len(password) >= 16
    assert files["broker.env"]["DELIVERY_BROKER_URL"].startswith(f"redis://:{password}@")
    pg = files["postgres.env"]["POSTGRES_PASSWORD"]
    assert f":{pg}@" in files["database.env"]["DELIVERY_DATABASE_URL"] and pg != password
    config = flower_config(monkeypatch, tmp_path, files["flower.env"]["FLOWER_BASIC_AUTH"])
    assert config["basic_auth"] == [files["flower.env"]["FLOWER_BASIC_AUTH"]]
    # the receiver takes the secret written, and refuses the example's placeholder
    assert len(decode_secrets(files["receipts.env"]["DELIVERY_RECEIPTS_SECRET"])[0]) == 32
    with pytest.raises(ValueError):
        decode_secrets(env_files()["receipts.env"]["DELIVERY_RECEIPTS_SECRET"])
    binary = shutil.which("docker-compose")
    if binary is None:
        if IN_CI:
            pytest.fail("docker-compose is not installed; CI=true requires it")
        return
    result = subprocess.run(
        [binary, "-f", str(COMPOSE), "config"],
        cwd=ROOT,
        env={**os.environ, "DELIVERY_ENV_DIR": str(target)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"REDIS_PASSWORD: {password}" in result.stdout


def test_env_example_and_toml_configure_the_compose_services() -> None:
    """deploy/env.example/ names every DELIVERY_* setting, and with it deploy/delivery.toml
    loads into valid settings whose provider is the stub service on its port."""
    env = env_example()
    for name in ("DELIVERY_DATABASE_URL", "DELIVERY_BROKER_URL", "DELIVERY_REDIS_URL"):
        assert env[name], name
    assert env["DELIVERY_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["DELIVERY_DATABASE_URL"]
    assert env["DELIVERY_BROKER_URL"].startswith("redis://:")
    assert "@redis:6379/" in env["DELIVERY_BROKER_URL"]
    mounted = compose()["x-service"]["volumes"][0]
    source, target, _ = mounted.split(":")
    assert env["DELIVERY_CONFIG"] == target
    settings = load_settings({**env, "DELIVERY_CONFIG": str(ROOT / source)})
    assert settings.max_countdown == 300
    assert {p.base_url for p in settings.providers.values()} == {"http://stub:9090"}
    assert set(settings.channels) == {"sms", "email", "webhook"}


def test_each_service_starts_with_only_its_own_env_files() -> None:
    """deploy/delivery.toml asks no service for a secret it is not given: the worker's
    start-up check passes on the worker's files, and the receiver's protocols on its own."""
    from delivery.receipts.protocols import protocols

    config = str(ROOT / compose()["x-service"]["volumes"][0].split(":")[0])
    files = make_env_files()
    for service in ("worker", "receiver"):
        env: dict[str, str] = {}
        for name in ENV_FILES[service]:
            env.update(files[name])
        settings = load_settings(
            {**env, "DELIVERY_CONFIG": config}, publishes=service != "receiver"
        )
        if service == "worker":
            check_secrets(settings, env)
        else:
            assert set(protocols(settings, env)) == {"stub"}


def make_env_files() -> dict[str, dict[str, str]]:
    """What deploy/make_env.py writes (the example folder's placeholders filled)."""
    import runpy
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "env"
        runpy.run_path(str(ROOT / "deploy" / "make_env.py"), run_name="make_env")["main"](target)
        return env_files(target)


def test_dockerfile_is_slim_non_root_and_bakes_no_secret() -> None:
    """The image is python:3.11-slim, installs the package with pip, runs as a non-root user,
    copies no .env file and sets no secret-looking variable."""
    text = DOCKERFILE.read_text()
    instructions = [
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    ]
    assert instructions[0] == "FROM python:3.11-slim"
    assert re.search(r'pip install "?\.(\[[a-z,]+\])?"?', text)
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    last_run = max(i for i, line in enumerate(instructions) if line.startswith("RUN "))
    last_user = max(i for i, line in enumerate(instructions) if line.startswith("USER "))
    assert last_user > last_run, "everything after USER runs unprivileged"
    for line in instructions:
        if line.startswith(("COPY", "ADD")):
            assert ".env" not in line, line
            assert line.split()[1] != ".", f"{line}: copy named paths only"
        if line.startswith(("ENV", "ARG")):
            assert not re.search(r"SECRET|PASSWORD|TOKEN|API_KEY|AUTH", line), line
