"""``python -m bench [NAME ...]``: run the benchmarks one after another (each in its own
process, which prints its JSON line and stops what it started), then re-render the table."""

from __future__ import annotations

import subprocess
import sys

from bench.table import ORDER, write_readme

SUITE = list(ORDER)


def main(argv: list[str]) -> int:
    names = argv or SUITE
    unknown = sorted(set(names) - set(SUITE))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(SUITE)}")
        return 2
    failed = []
    for name in names:
        if subprocess.run([sys.executable, "-m", f"bench.{name}"]).returncode != 0:
            failed.append(name)
    write_readme()
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
