"""Start and stop the service's processes (celery worker and beat, the stub provider) as
real subprocesses, for ``delivery demo`` and the test suite."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, ask for SIGTERM when the parent dies, so that a
    demo or test run killed outright (SIGKILL, a CI timeout) leaves no worker, beat or stub
    behind to take the next run's messages."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


__all__ = [
    "ServiceProcess",
    "beat",
    "free_port",
    "start_all",
    "stop_all",
    "stub_provider",
    "worker",
]

#: Where ``free_port`` picks: below Linux's default ephemeral range (32768-60999), from which
#: every outgoing connection (to PostgreSQL, Redis, a provider) takes its local port.
_PORTS = range(20000, 32768)
_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A port on 127.0.0.1 for a service this process is about to start: free when checked,
    never handed out before by this process, and outside the ephemeral range. A port the
    system picked (``bind(0)``) is from that range, where any outgoing connection may take
    it before the service binds it ("Address already in use", a flaky start)."""
    with _ports_lock:
        for _ in range(1000):
            port = random.choice(_PORTS)
            if port in _handed_out:
                continue
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1}")


class ServiceProcess:
    """A subprocess whose output goes to ``log``; ``start`` waits for ``ready`` in it."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log: Path,
        ready: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name, self.argv, self.log, self.ready = name, list(argv), log, ready
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        """Spawn the process and wait until ``ready`` is in its log (``timeout`` seconds)."""
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> ServiceProcess:
        """Spawn the process without waiting for it (``wait_ready`` does)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return self

    def wait_ready(self, timeout: float = 60.0) -> ServiceProcess:
        """Wait until ``ready`` is in what the spawned process logged; stop it and raise if it
        ends or ``timeout`` seconds pass first."""
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log.open("rb") as f:
                f.seek(self._offset)
                if self.ready.encode() in f.read():
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        tail = self.log.read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"{self.name} did not start (looked for {self.ready!r}):\n{tail}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group and wait ``timeout`` seconds for it, then SIGKILL it."""
        self.terminate()
        self.wait_stopped(time.monotonic() + timeout)

    def terminate(self) -> None:
        """SIGTERM the process group without waiting (``wait_stopped`` does)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_stopped(self, deadline: float) -> None:
        """Wait until the process ended, SIGKILLing its group at ``deadline`` (monotonic)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()


def start_all(procs: Sequence[ServiceProcess], timeout: float = 60.0) -> list[ServiceProcess]:
    """Spawn every process, then wait until each is ready: their start-ups overlap instead of
    adding up. If one does not start, the others are stopped and the error raised."""
    spawned: list[ServiceProcess] = []
    try:
        for proc in procs:
            spawned.append(proc.spawn())
        deadline = time.monotonic() + timeout
        for proc in spawned:
            proc.wait_ready(max(0.0, deadline - time.monotonic()))
    except BaseException:
        stop_all(spawned)
        raise
    return spawned


def stop_all(procs: Sequence[ServiceProcess], timeout: float = 15.0) -> None:
    """SIGTERM every process, then wait for each (SIGKILL after ``timeout``): their shutdowns
    overlap instead of adding up."""
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.wait_stopped(deadline)


def _python_m(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS...`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def worker(
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    pool: str = "threads",
    concurrency: int = 8,
    name: str = "worker",
    cwd: Path | None = None,
    extra: Sequence[str] = (),
) -> ServiceProcess:
    argv = _python_m(
        "celery",
        *("-A", "delivery.worker", "worker", "--pool", pool, "--concurrency", str(concurrency)),
        *("--loglevel", "INFO", "-n", f"{name}@%h", "--without-gossip", "--without-mingle"),
        *extra,
    )
    return ServiceProcess(name, argv, log=log, ready="ready.", env=env, cwd=cwd)


def beat(
    log: Path, schedule: Path, *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> ServiceProcess:
    argv = _python_m(
        "celery", "-A", "delivery.worker", "beat", "--loglevel", "DEBUG", "-s", str(schedule)
    )
    return ServiceProcess("beat", argv, log=log, ready="beat: Starting", env=env, cwd=cwd)


def stub_provider(
    log: Path, port: int, *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> ServiceProcess:
    argv = _python_m("delivery.testing.stub_provider", "--host", "127.0.0.1", "--port", str(port))
    return ServiceProcess("stub", argv, log=log, ready="listening on", env=env, cwd=cwd)
