"""``delivery demo`` on a machine with nothing configured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_demo_runs_on_the_embedded_default(tmp_path: Path) -> None:
    """With no DELIVERY_* settings, the demo runs worker and beat on SQLite and a file
    broker, and every message ends final with one effect per key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELIVERY_")}
    result = subprocess.run(
        [sys.executable, "-m", "delivery.cli", "demo", "--count", "12", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["statuses"] == {"sent": 11, "dead": 1}
    assert report["effects"] == 11 and report["duplicated_keys"] == 0
    assert (tmp_path / ".delivery" / "outbox.sqlite3").exists()


def test_demo_console_leaves_the_console_running_on_the_demo_outbox(tmp_path: Path) -> None:
    """``delivery demo --console`` runs the demo, then serves the console on its outbox with a
    printed one-time operator: the overview shows the demo's sent messages; SIGINT stops it."""
    import re
    import signal
    import time

    import httpx

    from tests.conftest import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("DELIVERY_")}
    port = free_port()
    argv = ["demo", "--count", "4", "--console", "--console-port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "delivery.cli", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        login = None
        deadline = time.monotonic() + 170
        while login is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            login = re.search(r"ops console on (\S+) \(user demo, password (\S+)\)", line)
        assert login is not None, "the console did not start"
        url, password = login.group(1), login.group(2)
        page = httpx.get(url + "/", auth=("demo", password), timeout=10)
        assert page.status_code == 200
        assert re.search(r'<span class="count">3</span><span class="badge s-sent">', page.text)
        assert httpx.get(url + "/", timeout=10).status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
