"""A private cluster for the chaos scenarios: its own PostgreSQL and Redis servers (so that
restarting them harms no one else), the stub provider behind a ``FaultProxy``, and celery
worker and beat processes started with an explicit environment.

Used by ``tests/chaos.py`` (the scenarios), the chaos and security tests, and
``bench/chaos.py``. Nothing here reads or changes the test suite's shared servers; RabbitMQ,
when asked for, is the machine's own (queue ``delivery`` on vhost ``/``, purged around a run).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import delivery
from delivery.config.loading import load_settings
from delivery.config.settings import ProviderConfig, Settings
from delivery.core.status import FINAL
from delivery.outbox import enqueue as outbox
from delivery.runtime.db import make_engine, upgrade
from delivery.testing.processes import (
    ServiceProcess,
    beat,
    free_port,
    start_all,
    stop_all,
    stub_provider,
    worker,
)
from delivery.testing.stub_provider import StubClient
from tests.factories import OUTBOX_TABLES
from tests.faultproxy import FaultProxy

__all__ = [
    "RABBITMQ_URL",
    "ROOT",
    "ChaosConfig",
    "Cluster",
    "Feeder",
    "Pipeline",
    "PrivatePostgres",
    "PrivateRedis",
    "ServiceMissing",
    "campaign_size",
    "free_port",
    "no_nudge",
    "overrides",
    "wait_until",
]

ROOT = Path(__file__).resolve().parents[1]
RABBITMQ_URL = os.environ.get("DELIVERY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
QUEUE = "delivery"
# Messages per campaign (``enqueue_many``) in the feeder: two ``deliver_batch`` tasks of 50.
# A run of fewer than ``2 * CAMPAIGN`` messages has campaigns of half its messages
# (``campaign_size``); one of at least ``batch_size`` (50) still goes out as a batch task.
CAMPAIGN = 100


class ServiceMissing(RuntimeError):
    """A server the chaos cluster needs cannot be started or reached here."""


def wait_until(predicate: Callable[[], bool], timeout: float, every: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------------------------------
# Private servers


class PrivateRedis:
    """``redis-server`` on a free port, no persistence: a restart loses everything, as a
    broker that restarts without AOF would."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> PrivateRedis:
        exe = shutil.which("redis-server")
        if exe is None:
            raise ServiceMissing("redis-server is not installed")
        argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--daemonize", "no", "--dir", str(self.dir)]
        with (self.dir / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if not wait_until(lambda: _port_open(self.port), 15):
            self.stop()
            raise ServiceMissing(f"redis-server did not start on port {self.port}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self, down: float = 0.0) -> None:
        self.stop()
        time.sleep(down)
        self.start()
        self.restarts += 1

    def client(self, db: int = 0) -> Any:
        import redis

        return redis.Redis.from_url(self.url(db), socket_timeout=5)


class PrivatePostgres:
    """A throw-away PostgreSQL cluster (``initdb`` + ``pg_ctl``) on a free port, trust auth,
    its socket in its own directory. Run as the ``postgres`` user when we are root."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "pg"
        self.data = self.dir / "data"
        self.port = free_port()
        self.bin = self._bindir()
        self.restarts = 0

    @staticmethod
    def _bindir() -> Path:
        found = sorted(
            Path("/usr/lib/postgresql").glob("*/bin/initdb"),
            key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
        )
        if found:
            return found[-1].parent
        exe = shutil.which("initdb")
        if exe is None:
            raise ServiceMissing("PostgreSQL's initdb is not installed")
        return Path(exe).parent

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        result = subprocess.run(
            [*prefix, *argv], capture_output=True, text=True, timeout=120, cwd="/"
        )
        if result.returncode != 0:
            raise ServiceMissing(f"{argv[0]} failed: {result.stdout}{result.stderr}"[-2000:])

    def url(self, database: str = "delivery") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> PrivatePostgres:
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "-E", "UTF8", "--no-sync", "--no-instructions",
        )  # fmt: skip
        return self

    def start(self) -> PrivatePostgres:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c shared_buffers=32MB"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "pg.log"),
            "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down: float = 0.0) -> None:
        self.stop()
        time.sleep(down)
        self.start()
        self.restarts += 1

    def create_database(self, name: str = "delivery") -> None:
        admin = make_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()


# ---------------------------------------------------------------------------------------------
# Configuration and processes


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """The TOML a scenario runs with: short leases and backoff so that recovery is quick.
    ``send_lease`` must exceed the provider's total timeout (connect+write+read+pool)."""

    max_attempts: int = 10
    backoff_base: float = 0.1
    backoff_cap: float = 1.0
    relay_interval: float = 0.25
    sweep_interval: float = 0.5
    dispatch_lease: float = 6.0
    send_lease: float = 6.0
    connect: float = 0.5
    write: float = 0.5
    read: float = 1.5
    pool: float = 1.0
    breaker_enabled: bool = True
    breaker_reset: float = 1.0  # the default breaker, probing sooner to keep scenarios short
    concurrency: int = 16
    api_key_env: str | None = None
    email_provider: str = "stub"
    extra_toml: str = ""

    def toml(self, base_url: str) -> str:
        auth = f'api_key_env = "{self.api_key_env}"\n' if self.api_key_env else ""
        breaker = ""
        if "breaker" in {f.name for f in fields(ProviderConfig)}:
            breaker = (
                "\n[providers.stub.breaker]\n"
                f"enabled = {'true' if self.breaker_enabled else 'false'}\n"
                f"reset_timeout = {self.breaker_reset}\n"
            )
        return (
            "# written by tests/chaos_cluster.py\n"
            "[delivery]\n"
            f"max_attempts = {self.max_attempts}\n"
            f"relay_interval = {self.relay_interval}\n"
            f"sweep_interval = {self.sweep_interval}\n"
            f"dispatch_lease = {self.dispatch_lease}\n"
            f"send_lease = {self.send_lease}\n\n"
            f"[backoff]\nbase = {self.backoff_base}\ncap = {self.backoff_cap}\n\n"
            f"[timeouts]\nconnect = {self.connect}\nwrite = {self.write}\n"
            f"read = {self.read}\npool = {self.pool}\n\n"
            f'[providers.stub]\nkind = "http"\nbase_url = "{base_url}"\n{auth}{breaker}\n'
            '[channels.sms]\nprovider = "stub"\n\n'
            f'[channels.email]\nprovider = "{self.email_provider}"\n\n'
            '[channels.webhook]\nprovider = "stub"\n' + self.extra_toml
        )


def overrides(config: ChaosConfig) -> dict[str, Any]:
    """The settings of ``config`` that differ from ``ChaosConfig()``'s defaults."""
    default = ChaosConfig()
    return {
        f.name: getattr(config, f.name)
        for f in fields(config)
        if getattr(config, f.name) != getattr(default, f.name) and f.name != "extra_toml"
    }


class Pipeline:
    """One celery worker and one celery beat on the cluster, with an explicit environment."""

    def __init__(self, logs: Path, env: Mapping[str, str], config: ChaosConfig) -> None:
        self.logs, self.env, self.config = logs, dict(env), config
        self.concurrency = config.concurrency
        self.worker: ServiceProcess | None = None
        self.beat: ServiceProcess | None = None
        self.kills = 0

    def _worker(self, extra: Sequence[str] = ()) -> ServiceProcess:
        return worker(
            self.logs / "worker.log",
            env=self.env,
            concurrency=self.concurrency,
            cwd=ROOT,
            extra=extra,
        )

    def _beat(self) -> ServiceProcess:
        schedule = self.logs / "beat-schedule"
        for old in self.logs.glob("beat-schedule*"):
            old.unlink()
        return beat(self.logs / "beat.log", schedule, env=self.env, cwd=ROOT)

    def start_worker(self, extra: Sequence[str] = ()) -> None:
        """Start the worker (``extra``: more ``celery worker`` arguments, e.g. ``--include``)."""
        self.worker = self._worker(extra).start()

    def start_beat(self) -> None:
        self.beat = self._beat().start()

    def start(self) -> Pipeline:
        """Start worker and beat side by side (their start-ups overlap)."""
        self.worker, self.beat = start_all([self._worker(), self._beat()])
        return self

    def kill_worker(self) -> None:
        """SIGKILL the worker's whole process group, as a crash (or the OOM killer) would."""
        assert self.worker is not None
        self.worker.kill()
        self.kills += 1

    def stop_beat(self) -> None:
        if self.beat is not None:
            self.beat.stop()

    def stop(self) -> None:
        stop_all([proc for proc in (self.beat, self.worker) if proc is not None])

    def logs_text(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.logs.glob("*.log")) if p.is_file()
        )


@contextlib.contextmanager
def no_nudge() -> Iterator[None]:
    """Turn the post-commit nudge off in this process: the nudge publishes with the ``tasks``
    app of this process, whose broker is fixed at its first configuration (the test suite's),
    not the cluster's. The cluster's beat relay publishes instead."""
    previous = outbox._nudge
    outbox.set_nudge(None)
    try:
        yield
    finally:
        outbox.set_nudge(previous)


# ---------------------------------------------------------------------------------------------
# The cluster


class Cluster:
    """Private PostgreSQL and Redis, one stub provider process, one proxy in this process."""

    def __init__(self, workdir: Path | None = None, *, seed: int = 1) -> None:
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="delivery-chaos-"))
        self.dir.chmod(0o755)  # the postgres user must reach its data directory
        self.seed = seed
        self.pg = PrivatePostgres(self.dir)
        self.redis = PrivateRedis(self.dir)
        self.stub_port = free_port()
        self.stub_process: ServiceProcess | None = None
        self.stub = StubClient(f"http://127.0.0.1:{self.stub_port}")
        self.proxy = FaultProxy(self.stub_port, seed=seed)
        self.engine: Engine | None = None
        self.runs = 0

    def start(self) -> Cluster:
        try:
            self.redis.start()
            self.pg.init().start()
            self.pg.create_database()
            self.engine = make_engine(self.pg.url(), pool_size=2, max_overflow=2)
            upgrade(self.engine)
            self.stub_process = stub_provider(
                self.dir / "stub.log", self.stub_port, cwd=ROOT
            ).start()
            self.proxy.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, *, keep: bool = False) -> None:
        """Stop everything; remove the directory unless ``keep`` (logs of a failed run)."""
        self.proxy.stop()
        self.stub.close()
        if self.stub_process is not None:
            self.stub_process.stop()
        if self.engine is not None:
            self.engine.dispose()
        with contextlib.suppress(Exception):
            self.pg.stop()
        self.redis.stop()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def db(self) -> Engine:
        assert self.engine is not None, "cluster not started"
        return self.engine

    # --- brokers ------------------------------------------------------------------------------

    def broker_url(self, broker: str) -> str:
        if broker == "redis":
            return self.redis.url(0)
        if broker == "rabbitmq":
            return RABBITMQ_URL
        raise ValueError(f"broker: {broker!r} is not redis or rabbitmq")

    def purge_broker(self, broker: str) -> None:
        if broker == "redis":
            self.redis.client(0).flushdb()
            self.redis.client(1).flushdb()
            return
        from kombu import Connection

        with Connection(RABBITMQ_URL, connect_timeout=5) as conn:
            channel = conn.default_channel
            with contextlib.suppress(Exception):
                channel.queue_purge(QUEUE)

    @staticmethod
    def rabbitmq_reachable() -> bool:
        from kombu import Connection

        try:
            with Connection(RABBITMQ_URL, connect_timeout=3) as conn:
                conn.ensure_connection(max_retries=1)
        except Exception:
            return False
        return True

    # --- runs ---------------------------------------------------------------------------------

    def env(self, broker: str, config_path: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELIVERY_")}
        env.update(
            DELIVERY_DATABASE_URL=self.pg.url(),
            DELIVERY_BROKER_URL=self.broker_url(broker),
            DELIVERY_REDIS_URL=self.redis.url(1),
            DELIVERY_CONFIG=str(config_path),
            DELIVERY_HOME=str(self.dir / "home"),
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def reset(self, broker: str) -> None:
        """Empty outbox, broker and shared state; a stub and a proxy without faults."""
        with self.db.begin() as conn:
            conn.execute(text(f"TRUNCATE {OUTBOX_TABLES} RESTART IDENTITY"))
        self.purge_broker(broker)
        self.stub.reset()
        self.proxy.clear()
        self.proxy.reset_stats()

    @contextlib.contextmanager
    def pipeline(
        self, name: str, broker: str, config: ChaosConfig, *, start: bool = True, **env: str
    ) -> Iterator[tuple[Pipeline, Settings]]:
        """Reset, write ``config``, start worker and beat (unless ``start`` is false: then the
        caller starts them); stop them (and purge) afterwards. ``env`` adds variables."""
        self.runs += 1
        logs = self.dir / "runs" / f"{self.runs:02d}-{name}"
        logs.mkdir(parents=True, exist_ok=True)
        config_path = logs / "delivery.toml"
        config_path.write_text(config.toml(self.proxy.url))
        self.reset(broker)
        environment = self.env(broker, config_path, **env)
        settings = load_settings(environment)
        pipe = Pipeline(logs, environment, config)
        try:
            with no_nudge():
                if start:
                    pipe.start()
                yield pipe, settings
        finally:
            self.proxy.clear()  # first: sends held by a latency finish, so the worker stops
            pipe.stop()
            with contextlib.suppress(Exception):
                self.purge_broker(broker)

    # --- measurements -------------------------------------------------------------------------

    def counts(self) -> dict[str, int] | None:
        """Messages per status, or None while the database cannot be reached."""
        try:
            with self.db.connect() as conn:
                rows = conn.execute(
                    text("SELECT status, count(*) FROM delivery_messages GROUP BY status")
                )
                return {status: n for status, n in rows}
        except DBAPIError:
            return None

    def scalar(self, sql: str, **params: object) -> Any:
        with self.db.connect() as conn:
            return conn.scalar(text(sql), params)

    def wait_final(self, total: int, timeout: float) -> tuple[bool, dict[str, int]]:
        """Wait until ``total`` messages are all in a final status (nothing open)."""
        last: dict[str, int] = {}

        def done() -> bool:
            nonlocal last
            got = self.counts()
            if got is None:
                return False
            last = got
            return sum(n for s, n in got.items() if s in FINAL) == total

        return wait_until(done, timeout, every=0.2), last


# ---------------------------------------------------------------------------------------------
# Apps that keep enqueueing


def message_for(prefix: str, i: int) -> dict[str, Any]:
    """The i-th message of a run: SMS, email and webhook in turn, each with its own key."""
    key = f"{prefix}-{i:05d}"
    kind = i % 3
    if kind == 0:
        body = f"Your code is {i * 7919 % 1_000_000:06d}"
        return dict(key=key, channel="sms", to=f"+1201555{i % 10000:04d}", payload={"body": body})
    if kind == 1:
        return dict(
            key=key,
            channel="email",
            to=f"user{i}@example.com",
            payload={"subject": "Receipt", "body": f"Thanks ({key})"},
        )
    return dict(
        key=key,
        channel="webhook",
        to=f"https://hooks.example.com/h/{i}",
        payload={"event": "order.paid", "order": i},
    )


def campaign_size(n: int) -> int:
    """Messages per campaign in a run of ``n``: ``CAMPAIGN``, or half of a smaller run, so
    that half of every run goes through ``enqueue_many`` whatever its size."""
    return max(1, min(CAMPAIGN, n // 2))


def _plan(n: int, batch: int, campaign: int = CAMPAIGN) -> Iterator[tuple[int, int, bool]]:
    """The feeder's transactions as ``(first, last, campaign)``: in every ``2 * campaign``
    messages, the first half goes ``batch`` per transaction through ``enqueue`` (delivered one
    task each), the second half in one ``enqueue_many`` (a backlog: ``deliver_batch`` tasks)."""
    first = 0
    while first < n:
        if (first // campaign) % 2:
            last = min(first + campaign, n)
            yield first, last, True
        else:
            last = min(first + batch, (first // campaign + 1) * campaign, n)
            yield first, last, False
        first = last


@dataclass
class Feeder:
    """Enqueue ``n`` messages over ``duration`` seconds from a background thread, as apps
    would: half ``batch`` per transaction, half as campaigns (``_plan``). A failed
    transaction (database down) is retried with the same keys, which is safe: same key and
    payload returns the existing message (G3)."""

    engine: Engine
    settings: Settings
    prefix: str
    n: int
    duration: float
    batch: int = 5
    options: Callable[[int], dict[str, Any]] = field(default=lambda i: {})
    campaign: int = CAMPAIGN
    keys: list[str] = field(default_factory=list)
    retried: int = 0
    started: float = 0.0
    finished: float = 0.0
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    def start(self) -> Feeder:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float = 300.0) -> Feeder:
        assert self._thread is not None
        self._thread.join(timeout)
        if self.error is not None:
            raise RuntimeError("the feeder failed") from self.error
        return self

    def _run(self) -> None:
        try:
            for first, last, campaign in _plan(self.n, self.batch, self.campaign):
                due = self.started + self.duration * first / max(self.n, 1)
                time.sleep(max(0.0, due - time.monotonic()))
                batch = [
                    {**message_for(self.prefix, i), **self.options(i)} for i in range(first, last)
                ]
                self._commit(batch, campaign)
                self.keys.extend(spec["key"] for spec in batch)
        except BaseException as exc:
            self.error = exc
        self.finished = time.monotonic()

    def _commit(self, batch: list[dict[str, Any]], campaign: bool) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                with Session(self.engine) as session, session.begin():
                    if campaign:
                        delivery.enqueue_many(session, batch, settings=self.settings)
                    else:
                        for spec in batch:
                            delivery.enqueue(session, settings=self.settings, **spec)
                return
            except DBAPIError:
                if time.monotonic() > deadline:
                    raise
                self.retried += 1
                time.sleep(0.2)
