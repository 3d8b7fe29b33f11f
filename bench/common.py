"""What every benchmark shares: where it runs, the processes it starts (and always stops), and
how it reports: one JSON line on stdout, ``bench/results/NAME.json``, the table in README.md.

Importing this module points ``DELIVERY_*`` at the benchmark's own database and Redis dbs, so
import it before ``delivery.worker``. Slot N (``DELIVERY_BENCH_SLOT``, else
``DELIVERY_TEST_SLOT``, else 0) uses database ``delivery_bench{N}`` and Redis dbs 14-2N
(broker) and 15-2N (shared state), the same Redis dbs as the test suite's slot N: do not run
both at once on one slot.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Integer, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from delivery.testing.processes import free_port

if "delivery.worker.deliver" in sys.modules:  # it read the settings already: they would not be ours
    raise RuntimeError("import bench.common before tasks (tasks reads DELIVERY_* at import)")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

SLOT = int(os.environ.get("DELIVERY_BENCH_SLOT") or os.environ.get("DELIVERY_TEST_SLOT") or 0)
PG_SERVER = os.environ.get("DELIVERY_BENCH_PG", "postgresql+psycopg://root@127.0.0.1:5432")
PG_DB = f"delivery_bench{SLOT or ''}"
PG_URL = f"{PG_SERVER}/{PG_DB}"
# Eight slots per Redis server (two dbs each): slots 8-15 use a second server on port 6380.
REDIS_SERVER = os.environ.get(
    "DELIVERY_TEST_REDIS", f"redis://127.0.0.1:{6379 if SLOT < 8 else 6380}"
)
BROKER_URL = f"{REDIS_SERVER}/{14 - 2 * (SLOT % 8)}"
REDIS_URL = f"{REDIS_SERVER}/{15 - 2 * (SLOT % 8)}"
RUN_DIR = Path(tempfile.mkdtemp(prefix="delivery-bench-"))
if os.environ.get("BENCH_KEEP_LOGS") != "1":
    atexit.register(shutil.rmtree, RUN_DIR, ignore_errors=True)


STUB_PORT = free_port()
STUB_URL = f"http://127.0.0.1:{STUB_PORT}"
CONFIG = RUN_DIR / "delivery.toml"
CONFIG.write_text(f"""# written by bench/common.py
[delivery]
# the product's defaults: leases, relay and sweeper intervals, batch size

[providers.stub]
kind = "http"
base_url = "{STUB_URL}"

[channels.sms]
provider = "stub"
on_unknown = "retry"
""")
#: The same configuration with one message per task: the path before batches.
SINGLE_CONFIG = RUN_DIR / "delivery-single.toml"
SINGLE_CONFIG.write_text(
    CONFIG.read_text().replace("[delivery]\n", "[delivery]\nbatch_size = 1\n", 1)
)
os.environ.update(
    DELIVERY_DATABASE_URL=PG_URL,
    DELIVERY_BROKER_URL=BROKER_URL,
    DELIVERY_REDIS_URL=REDIS_URL,
    DELIVERY_CONFIG=str(CONFIG),
    DELIVERY_HOME=str(RUN_DIR / "home"),
    BENCH_STUB_URL=STUB_URL,
)


def log(message: str) -> None:
    """Progress goes to stderr: stdout carries only the result line."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Database and Redis


class _BenchBase(DeclarativeBase):
    pass


class Order(_BenchBase):
    """The app's business row: one per transaction in the benchmarks."""

    __tablename__ = "bench_orders"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    ref: Mapped[str] = mapped_column(Text)
    amount: Mapped[int] = mapped_column(Integer)


def fresh_database(
    name: str = PG_DB, *, partition: bool = True, since: dt.date | None = None
) -> Any:
    """Create the benchmark database (``name``: this slot's, or a second one of its own, such
    as ``growth``'s large table) if needed, drop and re-migrate the outbox, add the business
    table ``bench_orders``; return an engine. The outbox is partitioned by day on PostgreSQL
    as ``delivery db upgrade`` leaves it (``partition=False``: not), its days from ``since``
    (for rows of past days: ``insert_rows(days=..)``) or from tomorrow."""
    from sqlalchemy import create_engine, text

    from delivery.runtime import conversion
    from delivery.runtime.db import make_engine, upgrade

    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if not conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}):
            conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    engine = make_engine(f"{PG_SERVER}/{name}")
    with engine.begin() as conn:
        conn.execute(
            text(f"DROP TABLE IF EXISTS {_outbox_tables()}, alembic_version, bench_orders CASCADE")
        )
    upgrade(engine, partition=False)
    if partition:
        conversion.partition(engine, start=since)
    _BenchBase.metadata.create_all(engine)
    return engine


def _outbox_tables() -> str:
    """Every table of the outbox, from its models and a partitioned outbox's keys table (none
    left out of a TRUNCATE or a DROP)."""
    from delivery.core.models import Base
    from delivery.runtime.partitions import KEYS_TABLE

    return ", ".join([KEYS_TABLE, *(table.name for table in reversed(Base.metadata.sorted_tables))])


def truncate(engine: Any) -> None:
    """Empty the outbox and the business table."""
    from sqlalchemy import text

    with engine.begin() as conn:
        tables = _outbox_tables()
        if not conn.scalar(text("SELECT to_regclass('delivery_keys')")):  # not partitioned
            tables = tables.replace("delivery_keys, ", "")
        conn.execute(text(f"TRUNCATE {tables}, bench_orders"))


def flush_redis() -> None:
    """Empty this slot's two Redis dbs (and no other)."""
    import redis

    for url in (BROKER_URL, REDIS_URL):
        redis.Redis.from_url(url).flushdb()


def queue_length(queue: str = "delivery") -> int:
    import redis

    return int(redis.Redis.from_url(BROKER_URL).llen(queue))


# ---------------------------------------------------------------------------------------------
# Processes


class Processes:
    """Every process a benchmark starts; ``stop_all`` (called on exit, also on SIGTERM/SIGINT)
    stops them, newest first."""

    def __init__(self) -> None:
        from delivery.testing.processes import ServiceProcess

        self._procs: list[ServiceProcess] = []

    def stub(self, port: int = STUB_PORT, name: str = "stub") -> Any:
        """Start a stub provider as its own process (on ``STUB_PORT`` unless given another
        ``port``; its log ``NAME.log``); return a ``StubClient`` for it."""
        from delivery.testing.processes import stub_provider
        from delivery.testing.stub_provider import StubClient

        self._procs.append(stub_provider(RUN_DIR / f"{name}.log", port, cwd=ROOT).start())
        return StubClient(f"http://127.0.0.1:{port}")

    def worker(
        self,
        app: str = "delivery.worker",
        *,
        pool: str = "threads",
        concurrency: int = 8,
        name: str = "w",
        env: dict[str, str] | None = None,
    ) -> Any:
        """A celery worker for ``app`` (``delivery.worker`` or ``bench.celery_alone``), logging at
        WARNING so that both paths pay the same (small) logging cost."""
        from delivery.testing.processes import ServiceProcess

        argv = [
            sys.executable,
            "-m",
            "bench.run_worker",
            app,
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "WARNING",
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        log_file = RUN_DIR / f"{name}.log"
        proc = ServiceProcess(
            name, argv, log=log_file, ready="bench-worker-ready", env=env, cwd=ROOT
        )
        self._procs.append(proc.start())
        return proc

    def beat(self, env: dict[str, str] | None = None) -> Any:
        from delivery.testing.processes import beat

        full = {**os.environ, **env} if env else None
        proc = beat(RUN_DIR / "beat.log", RUN_DIR / "beat-schedule", cwd=ROOT, env=full)
        self._procs.append(proc.start())
        return proc

    def pids(self) -> list[int]:
        """The pids of the running processes, oldest first."""
        return [p.pid for p in self._procs]

    def stop(self, proc: Any) -> None:
        proc.stop()
        if proc in self._procs:
            self._procs.remove(proc)

    def stop_all(self) -> None:
        while self._procs:
            with contextlib.suppress(Exception):
                self._procs.pop().stop()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def session() -> Iterator[Processes]:
    """The benchmark's lifetime: processes stopped and Redis flushed however it ends."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    procs = Processes()
    try:
        flush_redis()
        yield procs
    finally:
        procs.stop_all()
        with contextlib.suppress(Exception):
            flush_redis()
        signal.signal(signal.SIGTERM, previous)
        if os.environ.get("BENCH_KEEP_LOGS") == "1":
            log(f"logs kept in {RUN_DIR}")


# ---------------------------------------------------------------------------------------------
# Measuring


def wait_until(
    predicate: Callable[[], bool], timeout: float, every: float = 0.05, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise TimeoutError(f"{what} not met within {timeout} s")


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100), nearest rank."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def in_turn(names: Iterable[str], round_: int) -> list[str]:
    """``names`` in order in even rounds, reversed in odd ones: in alternating rounds no side
    always runs first (after the other's load, or on a cooler machine)."""
    order = list(names)
    return order if round_ % 2 == 0 else order[::-1]


def proc_memory(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of ``pid`` in KiB, from /proc."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (prefork pool processes), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.append(int(entry.name))
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# Reporting


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def environment(engine: Any = None) -> dict[str, Any]:
    """Versions and machine facts to print next to the figures."""
    from sqlalchemy import text

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "delivery": _version("delivery-outbox"),
        **{name: _version(name) for name in ("celery", "kombu", "redis", "httpx", "sqlalchemy")},
        "psycopg": _version("psycopg"),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    if engine is not None:
        with engine.connect() as conn:
            env["postgresql"] = conn.scalar(text("SHOW server_version"))
    with contextlib.suppress(Exception):
        import redis

        env["redis_server"] = redis.Redis.from_url(BROKER_URL).info("server")["redis_version"]
    with contextlib.suppress(Exception):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        env["git"] = head + (" + uncommitted changes" if dirty else "")
    return env


def row(
    metric: str,
    ratio: float | None,
    target: str,
    met: bool | None,
    delivery: str,
    baseline: str = "",
) -> dict[str, Any]:
    """One line of the README table: the ratio first, then the absolute figures."""
    return {
        "metric": metric,
        "ratio": None if ratio is None else round(ratio, 3),
        "target": target,
        "met": met,
        "delivery": delivery,
        "baseline": baseline,
    }


def report(
    name: str, figures: dict[str, Any], rows: list[dict[str, Any]], engine: Any = None
) -> None:
    """Print the one JSON line, keep it in ``bench/results/NAME.json``, rewrite the table."""
    result = {
        "bench": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "rows": rows,
        "figures": figures,
        "env": environment(engine),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    from bench.table import write_readme

    write_readme()
    print(json.dumps(result, separators=(",", ":")), flush=True)


def insert_rows(
    engine: Any,
    n: int,
    *,
    status: str = "pending",
    prefix: str = "bench",
    start: int = 0,
    due_seconds_ago: float = 1.0,
    days: float = 0,
) -> None:
    """Bulk-insert ``n`` outbox rows in one statement (``generate_series``): due ``pending``
    rows by default, or final rows (``status='sent'``) to grow the table. ``days``: created
    (and last changed, and sent) over that many days ending now, each row with an id of its
    day on a partitioned outbox (as if inserted then: ``fresh_database(since=..)`` gives the
    past days' partitions)."""
    from sqlalchemy import text

    from delivery.runtime import partitions

    sent = status == "sent"
    created = "now()"
    if days:
        created = f"now() - (CAST(:last AS bigint) - i) * interval '{days * 86400 / n} seconds'"
    with engine.begin() as conn:
        dated = days and partitions.is_partitioned(conn)
        sql = (
            """
                INSERT INTO delivery_messages ({id}
                    key, channel, provider, recipient, payload, payload_hash, on_unknown,
                    status, attempts, max_attempts, needs_lookup, next_attempt_at,
                    created_at, updated_at, sent_at, provider_ref)
                SELECT {id_value}:prefix || '-' || i, 'sms', 'stub',
                       '+1201555' || lpad((i % 10000)::text, 4, '0'),
                       json_build_object('body', 'code ' || i), md5(i::text), 'retry',
                       :status, CASE WHEN CAST(:sent AS boolean) THEN 1 ELSE 0 END, 8, false,
                       now() - make_interval(secs => CAST(:ago AS float8)), {created},
                       {created}, CASE WHEN CAST(:sent AS boolean) THEN {created} END,
                       CASE WHEN CAST(:sent AS boolean) THEN 'msg_' || i END
                FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS i
            """.replace("{id}", "id, " if dated else "")
            .replace("{id_value}", f"delivery_message_id({created}), " if dated else "")
            .replace("{created}", created)
        )
        conn.execute(
            text(sql),
            {
                "prefix": prefix,
                "status": status,
                "sent": sent,
                "ago": due_seconds_ago,
                "first": start,
                "last": start + n - 1,
            },
        )


def vacuum(engine: Any) -> None:
    from sqlalchemy import text

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE delivery_messages"))


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (those still alive), from /proc."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


def database_backends(engine: Any) -> list[int]:
    """PostgreSQL backend pids connected to the benchmark database (its CPU is ours)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        return list(
            conn.scalars(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            )
        )


class CpuMeter:
    """CPU seconds used between ``start`` and ``stop`` by groups of processes, each group given
    as a function returning its pids. A sampler thread asks again every ``every`` seconds, so
    processes (or database connections) that come and go in between are counted too, up to
    their last sample."""

    def __init__(self, groups: dict[str, Callable[[], Sequence[int]]], every: float = 0.2):
        self.groups = groups
        self.every = every
        self._first: dict[str, dict[int, float]] = {}
        self._last: dict[str, dict[int, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self, first: bool = False) -> None:
        for name, pids in self.groups.items():
            with contextlib.suppress(Exception):
                for pid in pids():
                    used = cpu_seconds([pid])
                    if first:
                        self._first[name][pid] = used
                    self._last[name][pid] = max(used, self._last[name].get(pid, 0.0))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def start(self) -> None:
        self._first = {name: {} for name in self.groups}
        self._last = {name: {} for name in self.groups}
        self._sample(first=True)
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return {
            name: sum(last - self._first[name].get(pid, 0.0) for pid, last in seen.items())
            for name, seen in self._last.items()
        }


# ---------------------------------------------------------------------------------------------
# bench/RELIABILITY.md's hardening table

HARDENING = "## Hardening"


def reliability_row(point: str, figures: str, baseline: str, bench: str) -> None:
    """Put one row (keyed by ``point``) in the table under ``## Hardening`` at the end of
    ``bench/RELIABILITY.md``, creating the section if needed; ``bench.chaos`` keeps it when
    it rewrites the rest of the document."""
    path = ROOT / "bench" / "RELIABILITY.md"
    text = path.read_text() if path.exists() else ""
    head, _, section = text.partition(HARDENING)
    lines = section.strip("\n").splitlines() if section else []
    if len(lines) < 4:
        lines = [
            "Each row: a hardening point measured next to its baseline in the same run, with "
            "the load average (`/proc/loadavg`, 1/5/15 min, before -> after the run).",
            "",
            "| point | figures | baseline (same run) | run (UTC) | by |",
            "|---|---|---|---|---|",
        ]
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")

    def cell(value: str) -> str:
        return value.replace("|", "\\|").replace("\n", " ")

    new = f"| {cell(point)} | {cell(figures)} | {cell(baseline)} | {when} | `{bench}` |"
    kept = [line for line in lines if not line.startswith(f"| {cell(point)} |")]
    body = "\n".join([*kept, new])
    path.write_text(f"{head.rstrip()}\n\n{HARDENING}\n\n{body}\n")
