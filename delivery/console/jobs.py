"""Bulk repairs run in a background thread, in batches, each batch its own transaction, so a
page can show progress while they run and a crash loses at most the batch in flight.

A job is a frozen ``BulkRequest`` (what to do to which ids, on whose behalf); ``Jobs.start``
returns its id and ``Jobs.get`` its ``Progress``. Jobs live in the console process only.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from delivery import ops
from delivery.core.models import Message

__all__ = ["BATCH", "BulkRequest", "Jobs", "Progress"]

BATCH = 200


@dataclass(frozen=True, slots=True)
class BulkRequest:
    """``action`` (``redrive``, ``resolve-sent``, ``resolve-dead``) on ``ids`` by ``actor``."""

    action: str
    ids: Sequence[int]
    actor: str
    label: str


@dataclass
class Progress:
    """How far a job is: ``done`` of ``total`` looked at, ``changed`` of them repaired."""

    request: BulkRequest
    total: int
    done: int = 0
    changed: int = 0
    skipped: list[str] = field(default_factory=list)
    finished: bool = False
    error: str | None = None


def _apply(session: Session, request: BulkRequest, ids: Sequence[int]) -> tuple[int, list[str]]:
    if request.action == "redrive":
        results = ops.redrive_ids(session, ids, actor=request.actor)
        skipped = [f"{r.key}: {r.reason}" for r in results if not r.redriven]
        return sum(r.redriven for r in results), skipped
    to_status = request.action.removeprefix("resolve-")
    keys = session.scalars(select(Message.key).where(Message.id.in_(ids)).order_by(Message.id))
    resolved = [ops.resolve(session, key, to_status, actor=request.actor) for key in keys]
    skipped = [f"{r.key}: {r.reason}" for r in resolved if not r.resolved]
    return sum(r.resolved for r in resolved), skipped


class Jobs:
    """The console's bulk jobs, by id."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._jobs: dict[str, Progress] = {}
        self._lock = threading.Lock()

    def start(self, request: BulkRequest) -> str:
        job_id = uuid.uuid4().hex[:12]
        progress = Progress(request, len(request.ids))
        with self._lock:
            self._jobs[job_id] = progress
        threading.Thread(
            target=self._run, args=(progress,), name=f"console-job-{job_id}", daemon=True
        ).start()
        return job_id

    def get(self, job_id: str) -> Progress | None:
        with self._lock:
            return self._jobs.get(job_id)

    def _run(self, progress: Progress) -> None:
        request = progress.request
        try:
            with self._sessions() as session:
                for start in range(0, len(request.ids), BATCH):
                    batch = request.ids[start : start + BATCH]
                    changed, skipped = _apply(session, request, batch)
                    session.commit()
                    progress.changed += changed
                    progress.skipped.extend(skipped[: max(0, 100 - len(progress.skipped))])
                    progress.done += len(batch)
        except Exception as exc:  # shown on the job's page; the batches before it are kept
            progress.error = f"{type(exc).__name__}: stopped after {progress.done} messages"
        finally:
            progress.finished = True
