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
ROW = re.compile(r"^\|\s*`(tests/test_[\w]+\.py)`\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|")


def _rows(doc: Path) -> list[tuple[str, int, int]]:
    if not doc.exists():
        return []
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in map(ROW.match, doc.read_text().splitlines()) if m]


def budgets(doc: Path = BUDGETS_DOC) -> dict[str, int]:
    """{"tests/test_x.py": seconds it may take} from the budget table's rows."""
    return {f: budget for f, budget, _ in _rows(doc)}


def measured(doc: Path = BUDGETS_DOC) -> dict[str, int]:
    """{"tests/test_x.py": seconds it took on the reference machine} from the same rows."""
    return {f: took for f, _, took in _rows(doc)}


class FileTimes:
    """Collects setup + call + teardown seconds per test file."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, duration: float) -> None:
        self.seconds[nodeid.split("::", 1)[0]] += duration

    def over_budget(self, table: dict[str, int], reference: dict[str, int]) -> list[tuple[str, float, float]]:
        """(file, seconds, allowed) for each file past its budget scaled by this run's pace (what these files
        took here over what they took on the reference machine); meant for whole `make test` runs."""
        ran = {f: s for f, s in self.seconds.items() if f in table}
        if not ran:
            return []
        pace = max(1.0, sum(ran.values()) / max(1, sum(reference.get(f, table[f]) for f in ran)))
        return [(f, s, table[f] * pace) for f, s in sorted(ran.items()) if s > table[f] * pace + 1.0]

    def unbudgeted(self, table: dict[str, int]) -> list[str]:
        return sorted(f for f in self.seconds if f not in table)
