"""Fixtures: real PostgreSQL, Redis, celery worker and beat processes, and the stub provider
over HTTP. The suite uses its own database (``delivery_test``) and Redis dbs 14 (broker) and
15 (shared state), and cleans them between tests.

A missing service fails the run under ``CI=true``; elsewhere the tests that need it skip.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from delivery.testing.processes import free_port

IN_CI = os.environ.get("CI") == "true"
# Several suites may run at once on one machine: slot N uses database delivery_test{N} and
# Redis dbs 14-2N (broker) and 15-2N (shared state). Slot 0 is the default.
SLOT = int(os.environ.get("DELIVERY_TEST_SLOT", "0"))
PG_SERVER = os.environ.get("DELIVERY_TEST_PG", "postgresql+psycopg://root@127.0.0.1:5432")
PG_DB = f"delivery_test{SLOT or ''}"
PG_URL = f"{PG_SERVER}/{PG_DB}"
# Eight slots per Redis server (two dbs each): slots 8-15 use a second server on port 6380.
REDIS_SERVER = os.environ.get(
    "DELIVERY_TEST_REDIS", f"redis://127.0.0.1:{6379 if SLOT < 8 else 6380}"
)
BROKER_URL = os.environ.get("DELIVERY_TEST_BROKER_URL", f"{REDIS_SERVER}/{14 - 2 * (SLOT % 8)}")
REDIS_URL = f"{REDIS_SERVER}/{15 - 2 * (SLOT % 8)}"
# The broker of a test whose own worker uses a database other than the suite's. The suite's
# session worker (``pipeline``) consumes BROKER_URL: sharing it, that worker takes the other
# database's tasks, finds no such message and drops them, and each one waits out a
# dispatch_lease before it is published again. Nothing consumes this slot's state db.
OWN_BROKER_URL = REDIS_URL
RUN_DIR = Path(tempfile.mkdtemp(prefix="delivery-tests-"))

# The tests press Ctrl-C (SIGINT) on the processes they start, as a terminal does. A suite
# started in the background by a shell without job control (`cmd &` in a script, nohup, some
# CI runners) begins with SIGINT ignored, and every child would inherit that: `delivery watch`
# would never see the Ctrl-C, nor would a bash trap (a shell cannot trap what it started
# with ignored). Restore a terminal's disposition, which the children then inherit.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


STUB_PORT = free_port()
CONFIG = RUN_DIR / "delivery.toml"
CONFIG.write_text(f"""
[delivery]
relay_interval = 0.2
sweep_interval = 0.5
dispatch_lease = 10
send_lease = 8
max_attempts = 8

[backoff]
base = 0.05
cap = 0.5

[timeouts]
connect = 1
write = 1
read = 3
pool = 1

[providers.stub]
kind = "http"
base_url = "http://127.0.0.1:{STUB_PORT}"

# The same stub without a circuit breaker, for the tests that make every first request fail on
# purpose to watch the retries: ten failures in a row rightly open the default breaker.
[providers.unguarded]
kind = "http"
base_url = "http://127.0.0.1:{STUB_PORT}"

[providers.unguarded.breaker]
enabled = false

[channels.sms]
provider = "stub"
on_unknown = "retry"

[channels.email]
provider = "stub"
on_unknown = "retry"

[channels.webhook]
provider = "stub"
on_unknown = "lookup"

[types.otp]
channel = "sms"
priority = "urgent"
ttl = 300
max_attempts = 10

[types.marketing]
channel = "sms"
on_unknown = "give_up"
priority = "bulk"
max_attempts = 3
""")

# Set before anything reads settings: this process (enqueue, the nudge) and every process
# the tests start use the same database, broker and provider.
os.environ.update(
    DELIVERY_DATABASE_URL=PG_URL,
    DELIVERY_BROKER_URL=BROKER_URL,
    DELIVERY_REDIS_URL=REDIS_URL,
    DELIVERY_CONFIG=str(CONFIG),
    DELIVERY_HOME=str(RUN_DIR / "home"),
)


def need(service: str, error: Exception) -> None:
    message = f"{service} is not reachable: {error}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: services are required)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_engine() -> Iterator[Engine]:
    """The suite's own PostgreSQL database, created if missing and migrated from scratch."""
    try:
        admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            exists = conn.scalar(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": PG_DB}
            )
            if not exists:
                conn.execute(text(f"CREATE DATABASE {PG_DB}"))
        admin.dispose()
    except Exception as exc:
        need("PostgreSQL", exc)
    from delivery.runtime.db import make_engine, upgrade
    from tests.factories import OUTBOX_TABLES

    engine = make_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {OUTBOX_TABLES}, alembic_version CASCADE"))
    upgrade(engine)
    yield engine
    engine.dispose()


@contextmanager
def own_outbox(name: str, run: Path, config: Path) -> Iterator[tuple[Engine, dict[str, str]]]:
    """For a test's own worker and beat: a database of its own on the suite's server
    (``own_database``, migrated) and the environment its processes take (that database,
    ``OWN_BROKER_URL``, this slot's state db, ``config``; their home in ``run``)."""
    from delivery.runtime.db import upgrade

    with own_database(name) as engine:
        upgrade(engine)
        yield (
            engine,
            {
                **os.environ,
                "DELIVERY_DATABASE_URL": engine.url.render_as_string(hide_password=False),
                "DELIVERY_BROKER_URL": OWN_BROKER_URL,
                "DELIVERY_REDIS_URL": REDIS_URL,
                "DELIVERY_CONFIG": str(config),
                "DELIVERY_HOME": str(run / "home"),
            },
        )


@contextmanager
def own_database(name: str) -> Iterator[Engine]:
    """An empty database of a test's own on the suite's server (``delivery_test{SLOT}_{name}``,
    dropped first if left over, and afterwards): an engine on it."""
    from delivery.runtime.db import make_engine

    db = f"{PG_DB}_{name}"
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {db}"))
    engine = make_engine(f"{PG_SERVER}/{db}")
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture(scope="session")
def redis_client():  # type: ignore[no-untyped-def]
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except Exception as exc:
        need("Redis", exc)
    return client


@pytest.fixture(scope="session")
def broker_ready(redis_client) -> None:  # type: ignore[no-untyped-def]
    if BROKER_URL.startswith("amqp"):
        from kombu import Connection

        try:
            with Connection(BROKER_URL, connect_timeout=3) as conn:
                conn.ensure_connection(max_retries=1)
        except Exception as exc:
            need("RabbitMQ", exc)


def flush_broker() -> None:
    if BROKER_URL.startswith("redis"):
        import redis

        redis.Redis.from_url(BROKER_URL).flushdb()
    else:
        from kombu import Connection

        with Connection(BROKER_URL) as conn:
            conn.default_channel.queue_purge("delivery")


@pytest.fixture(scope="session")
def stub(pg_engine: Engine):  # type: ignore[no-untyped-def]
    from delivery.testing.processes import stub_provider
    from delivery.testing.stub_provider import StubClient

    process = stub_provider(RUN_DIR / "stub.log", STUB_PORT).start()
    client = StubClient(f"http://127.0.0.1:{STUB_PORT}")
    yield client
    process.stop()


@pytest.fixture(scope="session")
def pipeline(pg_engine: Engine, broker_ready: None, stub):  # type: ignore[no-untyped-def]
    """A running celery worker and celery beat against the suite's database and broker."""
    from delivery.testing.processes import beat, start_all, stop_all, worker

    flush_broker()
    procs = start_all(
        [worker(RUN_DIR / "worker.log"), beat(RUN_DIR / "beat.log", RUN_DIR / "beat-schedule")]
    )
    yield procs
    stop_all(procs)


@pytest.fixture
def clean(pg_engine: Engine, stub, redis_client) -> Engine:  # type: ignore[no-untyped-def]
    """Empty outbox, closed breakers (shared state flushed) and a stub with no faults."""
    from tests.factories import empty_outbox

    with pg_engine.begin() as conn:
        empty_outbox(conn)
    redis_client.flushdb()
    stub.reset()
    return pg_engine


@pytest.fixture
def live(pipeline, clean: Engine) -> Engine:  # type: ignore[no-untyped-def]
    """The whole pipeline running, on an empty outbox."""
    return clean


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A private PostgreSQL, Redis and stub provider (``tests/chaos_cluster.py``), started once
    for the session and shared by the modules that run on it: each run on it
    (``Cluster.pipeline``) starts from an empty outbox, broker and shared state, a stub and a
    proxy without faults. Removed at the end (kept, with every process log, if a test failed
    meanwhile)."""
    from tests.chaos_cluster import Cluster, ServiceMissing

    box = Cluster()
    try:
        box.start()
    except ServiceMissing as exc:
        need("the private cluster", exc)
    failed_before = request.session.testsfailed
    yield box
    keep = request.session.testsfailed > failed_before
    box.stop(keep=keep)
    if keep:
        print(f"\nchaos cluster logs kept in {box.dir}")


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM delivery_messages GROUP BY status"))
        return {status: n for status, n in rows}


def drained(engine: Engine, total: int, timeout: float = 90.0) -> dict[str, int]:
    """Wait until all ``total`` messages are in a final status; return the counts."""
    from delivery.core.status import FINAL

    final = tuple(FINAL)

    def done() -> bool:
        c = counts(engine)
        return sum(c.get(s, 0) for s in final) == total

    try:
        wait_until(done, timeout)
    except AssertionError:
        raise AssertionError(f"not drained: {counts(engine)}") from None
    return counts(engine)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Keep the logs of a failed run in RUN_DIR; remove them after a green one."""
    if exitstatus == 0:
        import shutil

        shutil.rmtree(RUN_DIR, ignore_errors=True)
    else:
        print(f"\nprocess logs kept in {RUN_DIR}")


@pytest.fixture
def db_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A migrated SQLite outbox that the ``delivery`` CLI (run with CliRunner) will use. The
    process's settings are read again afterwards: any read while this environment was set
    (an ``enqueue``, its nudge's publish) must not outlive the test."""
    from click.testing import CliRunner

    from delivery.cli import main
    from delivery.runtime.current import configure

    url = f"sqlite:///{tmp_path}/cli.sqlite3"
    monkeypatch.setenv("DELIVERY_DATABASE_URL", url)
    monkeypatch.delenv("DELIVERY_CONFIG", raising=False)
    monkeypatch.delenv("DELIVERY_REDIS_URL", raising=False)
    result = CliRunner().invoke(main, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    yield url
    configure(None)


@pytest.fixture
def session(db_url: str) -> Iterator[Session]:
    """A session on that outbox."""
    from delivery.runtime.db import make_engine, make_sessionmaker

    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as session:
        yield session
    engine.dispose()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this checkout as a clone has it (tracked and new files, nothing ignored),
    built once per session with ``pip wheel --no-deps``."""
    import subprocess
    import sys

    from tests.test_examples import fresh_copy

    source = fresh_copy(tmp_path_factory.mktemp("wheel-source"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        check=True,
        timeout=600,
    )
    [wheel] = out.glob("delivery_outbox-*.whl")
    return wheel
