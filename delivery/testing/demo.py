"""``delivery demo``: the whole pipeline on the embedded default, with faults injected.

It starts the stub provider (in this process), a celery worker and celery beat (as real
subprocesses), enqueues a batch in one committed transaction, makes the stub drop some
answers after accepting them, fail some with 503 and reject one number for good, then waits
until every message is final and reports the outcome per status and the effects the
provider saw per key.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from delivery.config.loading import load_settings
from delivery.core.models import Message
from delivery.core.status import FINAL, Status
from delivery.outbox.enqueue import enqueue
from delivery.runtime.db import make_engine, upgrade
from delivery.testing.processes import beat, start_all, stop_all, worker
from delivery.testing.stub_provider import StubServer

__all__ = ["DemoReport", "run_demo"]

REJECTED = "+12015550199"


@dataclass(frozen=True, slots=True)
class DemoReport:
    statuses: dict[str, int]
    keys: int
    effects: int
    duplicated_keys: int
    dropped_answers: int
    provider_errors: int
    seconds: float


def _config(home: Path, stub_url: str) -> Path:
    path = home / "demo.toml"
    path.write_text(f"""# written by `delivery demo`
[delivery]
relay_interval = 0.5
sweep_interval = 1.0
max_attempts = 6

[backoff]
base = 0.2
cap = 2.0

[providers.stub]
kind = "http"
base_url = "{stub_url}"

[channels.sms]
provider = "stub"
on_unknown = "retry"
""")
    return path


def run_demo(
    count: int = 40, timeout: float = 120.0, progress: Callable[[str], None] = print
) -> DemoReport:
    home = Path(os.environ.get("DELIVERY_HOME", ".delivery")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with StubServer().start() as stub:
        config = _config(home, stub.url)
        env = dict(os.environ, DELIVERY_CONFIG=str(config), DELIVERY_HOME=str(home))
        settings = load_settings(env)
        engine = make_engine(settings.database_url)
        upgrade(engine)
        progress(
            f"outbox: {engine.url.render_as_string(hide_password=True)}; "
            f"broker: {settings.broker_url}; stub provider: {stub.url}"
        )
        stub.set_faults(
            drop_rate=0.2,
            error_rate=0.15,
            error_status=503,
            seed=42,
            rules={REJECTED: {"status": 400, "json": {"code": 21211, "message": "Invalid To"}}},
        )
        run = time.strftime("%Y%m%d%H%M%S")
        sends = [
            (f"+1201555{i % 10000:04d}", f"Your code is {100000 + i}", str(i))
            for i in range(count - 1)
        ]
        with Session(engine) as session, session.begin():
            for to, body, name in [*sends, (REJECTED, "never arrives", "rejected")]:
                enqueue(
                    session,
                    channel="sms",
                    to=to,
                    payload={"body": body},
                    key=f"demo-{run}-{name}",
                    settings=settings,
                )
        progress(
            f"enqueued {count} messages (20% of answers dropped after accept, "
            f"15% 503s, one invalid number)"
        )
        logs = home / "logs"
        procs = start_all(
            [
                worker(logs / "worker.log", env=env, concurrency=4),
                beat(logs / "beat.log", home / "beat-schedule", env=env),
            ]
        )
        try:
            deadline = time.monotonic() + timeout
            prefix = f"demo-{run}-%"
            while time.monotonic() < deadline:
                with Session(engine) as session:
                    rows = session.execute(
                        select(Message.status, func.count())
                        .where(Message.key.like(prefix))
                        .group_by(Message.status)
                    ).all()
                statuses = {str(s): int(n) for s, n in rows}
                if sum(n for s, n in statuses.items() if s in FINAL) == count:
                    break
                time.sleep(0.5)
        finally:
            stop_all(procs)
        engine.dispose()
        effects = {k: n for k, n in stub.effects().items() if k.startswith(f"demo-{run}-")}
        requests = stub.requests()
    ordered = {s.value: statuses.get(s.value, 0) for s in Status if statuses.get(s.value)}
    return DemoReport(
        statuses=ordered,
        keys=count,
        effects=sum(effects.values()),
        duplicated_keys=sum(1 for n in effects.values() if n > 1),
        dropped_answers=sum(1 for r in requests if r["outcome"] == "dropped"),
        provider_errors=sum(1 for r in requests if r["outcome"] == "error"),
        seconds=round(time.monotonic() - started, 1),
    )
