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
