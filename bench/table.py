"""Render ``bench/results/*.json`` as the results table in ``bench/README.md``.

Only the block between the ``results:start`` and ``results:end`` markers is rewritten;
everything else in the README (other sections too) is kept. ``python -m bench.table``
re-renders it from the stored results without running anything.
"""

from __future__ import annotations

import json
from typing import Any

from bench.common import RESULTS, ROOT

README = ROOT / "bench" / "README.md"
START = "<!-- results:start -->"
END = "<!-- results:end -->"
ORDER = [
    "stub_capacity",
    "relay_publish",
    "end_to_end",
    "app_way",
    "latency",
    "growth",
    "enqueue_cost",
    "worker_rss",
    "sender_floor",
    "http_cost",
    "receipts",
]


def _load() -> list[dict[str, Any]]:
    found = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    return [found[n] for n in names]


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|")


def render() -> str:
    results = _load()
    lines = [
        START,
        "",
        "_Written by the benchmark scripts (`python -m bench.table` re-renders it); "
        "do not edit by hand._",
        "",
        "| benchmark | measure | ratio | target | met | delivery | Celery alone / reference "
        "| run (UTC) |",
        "|---|---|---:|---|:-:|---|---|---|",
    ]
    for result in results:
        for r in result["rows"]:
            ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
            met = {True: "yes", False: "**no**", None: ""}[r["met"]]
            lines.append(
                "| "
                + " | ".join(
                    _cell(x)
                    for x in (
                        result["bench"],
                        r["metric"],
                        ratio,
                        r["target"],
                        met,
                        r["delivery"],
                        r["baseline"],
                        result["date"][:16].replace("T", " "),
                    )
                )
                + " |"
            )
    if results:
        lines += ["", "Versions and machine, per run:", ""]
        for result in results:
            env = result["env"]
            facts = ", ".join(f"{k} {v}" for k, v in env.items())
            lines.append(f"- `{result['bench']}` ({result['date']}): {facts}")
    lines += ["", END]
    return "\n".join(lines)


def write_readme() -> None:
    """Replace the marked block in README.md (append it if the markers are missing)."""
    text = README.read_text() if README.exists() else "# Benchmarks\n"
    block = render()
    if START in text and END in text:
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n## Results\n\n" + block + "\n"
    README.write_text(text)


if __name__ == "__main__":
    write_readme()
