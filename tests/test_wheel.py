"""The built wheel, installed as a user installs it: one top-level import name, and
``delivery demo`` runs from a folder of the user's that has its own ``tasks.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path


def test_the_wheel_installs_one_top_level_name(built_wheel: Path) -> None:
    """Everything in the wheel is under ``delivery/`` or its dist-info: no ``tasks`` (the most
    common name of a Celery module) to shadow an app's own, or be shadowed by it."""
    with zipfile.ZipFile(built_wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"delivery"}


def test_the_demo_runs_from_the_wheel_beside_an_apps_tasks_module(
    built_wheel: Path, tmp_path: Path
) -> None:
    """Installed from the wheel into a fresh venv (its dependencies taken from this
    environment's site-packages, without this checkout on the path), ``delivery demo`` run in
    a folder holding a trivial ``tasks.py`` sends every message: the worker loads the
    package's app, not the folder's module."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # This environment's packages after the venv's own (a plain path entry: the editable
    # install's finder in it is not run, so ``delivery`` can only come from the wheel).
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            str(built_wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    app = tmp_path / "app"
    app.mkdir()
    (app / "tasks.py").write_text("raise SystemExit('the app module was imported')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DELIVERY_", "PYTHON"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run(
        [python, "-c", "import delivery; print(delivery.__file__)"],
        cwd=app,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert where.startswith(str(venv)), where
    result = subprocess.run(
        [venv / "bin" / "delivery", "demo", "--count", "6", "--json"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert sum(report["statuses"].values()) == 6 and "pending" not in report["statuses"]
    assert report["duplicated_keys"] == 0
