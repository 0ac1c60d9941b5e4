"""Per-file test times from a pytest JUnit XML report, as docs/testing.md's budget table.

    .venv/bin/python -m pytest --junitxml=/tmp/run.xml      # (make test runs the same cases)
    .venv/bin/python scripts/test_budgets.py /tmp/run.xml   # the table: file, budget, measured

A budget is the measured time with room for noise (x1.2 + 1 s, rounded up to 5 s); keep the budgets you
set by hand, take the measured column from here. Exit code 1 when a file has no row in docs/testing.md.
"""

from __future__ import annotations

import math
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.timing_budget import FileTimes, budgets  # noqa: E402


def file_seconds(junit: Path) -> dict[str, float]:
    times = FileTimes()
    for case in ET.parse(junit).iter("testcase"):
        name = next((m for m in case.get("classname", "").split(".") if m.startswith("test_")), None)
        if name:
            times.add(f"tests/{name}.py::{case.get('name')}", float(case.get("time", 0)))
    return dict(times.seconds)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    measured = file_seconds(Path(argv[0]))
    table = budgets()
    print("| file | budget (s) | measured (s) |")
    print("| --- | ---: | ---: |")
    for f in sorted(measured, key=lambda f: -measured[f]):
        budget = table.get(f) or 5 * math.ceil((measured[f] * 1.2 + 1) / 5)
        print(f"| `{f}` | {budget} | {measured[f]:.0f} |")
    total = sum(measured.values())
    print(f"\ntotal measured: {total:.0f} s; total budget: {sum(table.get(f, 0) for f in measured)} s")
    missing = sorted(set(measured) - set(table))
    for f in missing:
        print(f"no budget row yet: {f}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
