"""Run the chaos scenarios of ``tests/chaos.py`` at a larger N and the bad-input checks of
``tests/test_bad_input.py``, and write ``bench/RELIABILITY.md`` from what the run measured.

    python -m bench.chaos                 # every scenario at N = 1000, then the document
    python -m bench.chaos --n 300 --only 1,5 --out /tmp/RELIABILITY.md

Everything runs on a private cluster (its own PostgreSQL and Redis in a temporary directory,
the stub provider behind the fault proxy, real celery worker and beat); the scenarios marked
RabbitMQ use the machine's RabbitMQ at ``amqp://guest:guest@127.0.0.1:5672//`` (queue
``delivery``, purged before and after) and are reported as skipped when it is down. Every
number in the document comes from the run; nothing is typed in. Exit status 1 if a guarantee
failed in any scenario.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # also runnable as ``python bench/chaos.py``
    sys.path.insert(0, str(ROOT))

from delivery.config.loading import load_settings  # noqa: E402
from tests import chaos  # noqa: E402
from tests import test_bad_input as bad  # noqa: E402
from tests.chaos_cluster import RABBITMQ_URL, ChaosConfig, Cluster, PrivatePostgres  # noqa: E402

OUT = ROOT / "bench" / "RELIABILITY.md"
BAD_TEST = "tests/test_bad_input.py"
ENQUEUE_TEST = "tests/test_enqueue.py"


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cell(value: Any, limit: int = 160) -> str:
    text = str(value).replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Running


def run_scenarios(cluster: Cluster, n: int, only: set[str] | None) -> list[chaos.Report]:
    reports = []
    rabbit = Cluster.rabbitmq_reachable()
    for scenario in chaos.SCENARIOS:
        if only and scenario.number not in only:
            continue
        for broker in scenario.brokers:
            number = scenario.number if broker == "redis" else f"9 ({scenario.number})"
            if broker == "rabbitmq" and not rabbit:
                skipped = chaos.Report(number, scenario.run.__name__, broker, n)
                skipped.failures.append(f"skipped: RabbitMQ unreachable at {RABBITMQ_URL}")
                reports.append(skipped)
                continue
            log(f"scenario {number} {scenario.run.__name__} on {broker}, N = {n}")
            started = time.monotonic()
            report = scenario.run(cluster, n, broker)
            report.figures["wall_s"] = round(time.monotonic() - started, 1)
            report.scenario = f"{number} {report.scenario}"
            log(report.summary())
            reports.append(report)
    return reports


def run_bad_input(cluster: Cluster, folder: Path) -> list[tuple[str, str, str, str]]:
    """(input, error, message, test) for every bad-input row, from real calls."""
    config = folder / "delivery.toml"
    config.write_text(ChaosConfig().toml(cluster.proxy.url))
    settings = load_settings(cluster.env("redis", config))
    cluster.reset("redis")
    rows = []
    test = f"{BAD_TEST}::test_bad_enqueue_is_refused_specifically"
    for case in bad.ENQUEUE_CASES:
        err = bad.refuse(cluster.db, case.kwargs, settings=settings)
        field = getattr(err, "field", "?")
        rows.append((case.what, f"`{type(err).__name__}` field `{field}`", str(err), test))
    err = bad.refuse_conflict(cluster.db, settings)
    rows.append(
        (
            "key reused with another payload",
            f"`{type(err).__name__}`",
            str(err),
            f"{ENQUEUE_TEST}::test_same_key_other_payload_conflicts_and_keeps_transaction",
        )
    )
    for what, toml, key in bad.CONFIG_CASES:
        cerr = bad.refuse_config(folder, toml, key)
        rows.append(
            (
                what,
                f"`ConfigError` key `{cerr.key}`",
                str(cerr),
                f"{ENQUEUE_TEST}::test_bad_config_names_the_key",
            )
        )
    cerr = bad.refuse_missing_config(folder)
    rows.append(
        (
            "config: DELIVERY_CONFIG names no file",
            f"`ConfigError` key `{cerr.key}`",
            str(cerr),
            f"{ENQUEUE_TEST}::test_missing_config_file_is_named",
        )
    )
    return rows


# ---------------------------------------------------------------------------------------------
# Writing


def _versions() -> str:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    def command(*argv: str) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        except OSError:
            return "?"
        return out.strip().splitlines()[0] if out.strip() else "?"

    git = command("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD")
    return (
        f"python {platform.python_version()}, celery {version('celery')}, kombu "
        f"{version('kombu')}, httpx {version('httpx')}, sqlalchemy {version('sqlalchemy')}; "
        f"{command('redis-server', '--version')}; "
        f"{command(str(PrivatePostgres._bindir() / 'postgres'), '--version')}; "
        f"{os.cpu_count()} CPUs, load {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"git {git}"
    )


def _defaults() -> str:
    config = ChaosConfig()
    return ", ".join(
        f"{f.name} {getattr(config, f.name)}"
        for f in fields(config)
        if getattr(config, f.name) not in (None, "")
    )


def _scenario_table(reports: list[chaos.Report]) -> list[str]:
    lines = [
        "| scenario | broker | messages | faults injected | sent / dead / unknown | lost "
        "| duplicate effects | drain (s) | after the fault (s) | result |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in reports:
        s = r.statuses
        outcome = "held" if r.ok else "**FAILED**: " + "; ".join(r.failures)
        if r.failures and r.failures[0].startswith("skipped"):
            outcome = r.failures[0]
        lines.append(
            f"| {cell(r.scenario)} ({cell(r.title)}) | {r.broker} | {r.messages} "
            f"| {cell(r.faults, 300)} | {s.get('sent', 0)} / {s.get('dead', 0)} / "
            f"{s.get('unknown', 0)} | {r.lost} | {r.duplicates} | {r.drain_s or '-'} "
            f"| {r.recovery_s if r.recovery_s is not None else '-'} | {cell(outcome, 300)} |"
        )
    return lines


def _figures(reports: list[chaos.Report]) -> list[str]:
    lines = []
    for r in reports:
        if not r.figures:
            continue
        figures = ", ".join(f"{k} {v}" for k, v in r.figures.items())
        lines.append(f"- **{cell(r.scenario)}** ({r.broker}): {cell(figures, 1000)}")
    return lines


def write(
    path: Path,
    reports: list[chaos.Report],
    bad_rows: list[tuple[str, str, str, str]],
    answers: list[bad.Ending],
    n: int,
    took: float,
) -> None:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    doc = [
        "# Reliability under faults",
        "",
        f"_Written by `python -m bench.chaos --n {n}` on {now} in {took / 60:.1f} min; do not "
        "edit by hand: run it again._ Versions and machine: " + _versions() + ".",
        "",
        "Each scenario of [`tests/chaos.py`](../tests/chaos.py) enqueues its messages from a "
        "background thread (SMS, email and webhook in turn; in every 200 messages, 100 in "
        "transactions of 5 through `enqueue`, which go out one task each, and 100 in one "
        "`enqueue_many` campaign, a backlog that goes out as `delivery.deliver_batch` tasks) on a "
        "private cluster: its own PostgreSQL and Redis, one celery worker (16 threads) and celery "
        "beat, the stub provider behind the fault proxy of "
        "[`tests/faultproxy.py`](../tests/faultproxy.py). It injects its fault while the "
        "messages flow, waits until nothing is open, then counts at the provider:",
        "",
        "- **lost**: a message without a row, still open when the wait gave up, or `sent` while "
        "the provider never saw its key;",
        "- **duplicate effects**: keys the provider took effect on more than once; and a "
        "scenario fails if any message has two accepted attempts (`delivered`/`found`) in "
        "`delivery_attempts`, even when the provider deduplicated the second;",
        "- **drain**: seconds from the first enqueue until every message is final; **after the "
        "fault**: from the end of the fault (restart done, provider back) until then.",
        "",
        "The same functions run at N = 200 (100 for the lost-answer scenarios) in "
        "[`tests/test_chaos.py`](../tests/test_chaos.py). "
        f"Settings of every run (`ChaosConfig`, seconds): {_defaults()}; a scenario's own "
        "changes are listed under `settings` in its figures.",
        "",
        "## Scenarios",
        "",
        *_scenario_table(reports),
        "",
        "Figures per scenario (attempts by outcome from `delivery_attempts`; "
        "`requeued_by_sweeper`: dispatched rows whose task was lost and that the sweeper put "
        "back to pending, summed from the worker log; `batch_tasks` / `in_batches`: batch tasks "
        "that finished and the messages they carried, from the worker log; `wall_s`: the "
        "scenario's wall time):",
        "",
        *_figures(reports),
        "",
        "## Bad input",
        "",
        "Each row is a real call; the error is the one raised. In every row nothing was "
        "written and the caller's transaction went on to commit its own work (checked by "
        "`tests.test_bad_input.refuse`).",
        "",
        "| input | error | message | test |",
        "|---|---|---|---|",
        *(f"| {cell(a)} | {b} | {cell(c, 220)} | `{cell(d)}` |" for a, b, c, d in bad_rows),
        "",
        "### A provider answering 2xx without a usable id",
        "",
        "End to end through a worker, the stub answering each recipient with one canned reply; "
        "`max_attempts = 2`. A message never ends `sent` without a provider reference "
        f"(`{BAD_TEST}::test_provider_answer_without_id_never_ends_sent`).",
        "",
        "| answer | policy | final status | provider_ref | code | attempts logged "
        "| effects at the provider |",
        "|---|---|---|---|---|---:|---:|",
        *(
            f"| {cell(e.what)} | {e.policy} | {e.status} | {e.provider_ref or '-'} "
            f"| {e.code or '-'} | {e.attempts} | {e.effects} |"
            for e in answers
        ),
        "",
        "## Security",
        "",
        "Proven by [`tests/test_security.py`](../tests/test_security.py) on a full run: task "
        "messages read raw from Redis and RabbitMQ hold only the message id and key; each "
        "provider secret (from `api_key_env`) reaches only its own provider and appears in no "
        "log, `delivery show` output or task message; keys and recipients with SQL and shell "
        "metacharacters are stored and sent verbatim; provider errors whose text names the "
        "recipient (in several spellings) leave no trace in the worker log at INFO, Flower's "
        "API, the broker's traffic (Redis MONITOR) or any CLI command's output.",
        "",
    ]
    # Sections other benches keep in this file (``<!-- bench.NAME -->`` ... ``<!-- /bench.NAME
    # -->``, e.g. bench/bounds.py) are carried over as they are, and so is the table under
    # ``## Hardening`` at the end (bench.common.reliability_row).
    old = _old(path)
    blocks = re.finditer(r"<!-- bench\.(\S+) -->.*?<!-- /bench\.\1 -->", old, re.S)
    console = ROOT / "bench" / "results" / "console_search.json"
    if console.exists():  # keep the section bench.console_search measured
        from bench.console_search import render_section

        doc += ["", render_section(json.loads(console.read_text())["figures"])]
    doc += [block.group(0) + "\n" for block in blocks]
    doc += ["".join(old.partition("## Hardening")[1:])]
    path.write_text("\n".join(doc))


def _old(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--n", type=int, default=1000, help="messages per scenario")
    parser.add_argument("--only", default="", help="scenario numbers, e.g. 1,3a,5")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    started = time.monotonic()
    cluster = Cluster().start()
    ok = False
    try:
        reports = run_scenarios(cluster, args.n, only)
        with tempfile.TemporaryDirectory() as folder:
            log("bad input")
            bad_rows = run_bad_input(cluster, Path(folder))
        log("provider answers without an id")
        answers = bad.provider_answers(cluster)
        write(args.out, reports, bad_rows, answers, args.n, time.monotonic() - started)
        ok = all(r.ok or r.failures[0].startswith("skipped") for r in reports)
        log(f"wrote {args.out}")
    finally:
        cluster.stop(keep=not ok)
        if not ok:
            log(f"logs kept in {cluster.dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
