"""Each test file's time budget (docs/testing.md) against what it took in this run.

The budgets are seconds on the reference machine named in docs/testing.md; `make test` prints, after its
summary, the files that took longer than their budget times this machine's factor (the run's total over the
reference total, so a slower machine is not reported file by file). A report, never a failure: speed is
measured, not asserted. A new test file needs a row (tests/test_docs_links.py checks it).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGETS_DOC = ROOT / "docs" / "testing.md"
ROW = re.compile(r"^\|\s*`(tests/test_[\w]+\.py)`\s*\|\s*(\d+)\s*\|")


def budgets(doc: Path = BUDGETS_DOC) -> dict[str, int]:
    """{"tests/test_x.py": seconds} from the budget table's rows."""
    out = {}
    if not doc.exists():
        return out
    for line in doc.read_text().splitlines():
        m = ROW.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


class FileTimes:
    """Collects setup + call + teardown seconds per test file."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, duration: float) -> None:
        self.seconds[nodeid.split("::", 1)[0]] += duration

    def over_budget(self, table: dict[str, int]) -> list[tuple[str, float, float]]:
        """(file, seconds, allowed) for each file past its budget scaled by this run's pace; files the
        run did not finish whole (a -k or a single test) are compared as well, so read it after full runs."""
        ran = {f: s for f, s in self.seconds.items() if f in table}
        if not ran:
            return []
        pace = max(1.0, sum(ran.values()) / max(1, sum(table[f] for f in ran)))
        return [(f, s, table[f] * pace) for f, s in sorted(ran.items()) if s > table[f] * pace + 1.0]

    def unbudgeted(self, table: dict[str, int]) -> list[str]:
        return sorted(f for f in self.seconds if f not in table)
